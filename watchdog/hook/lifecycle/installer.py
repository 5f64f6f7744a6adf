"""``install()``: configuration, slot file, monitor, patches, heartbeat, exit hooks.

One live monitor per process (two would publish two slots for one rank); a
second install() while one is open is a ValueError. Everything that can be
wrong with the *user's* input fails here, loudly; everything that goes wrong
in the environment afterwards (unwritable run dir, a torch API that moved) is
counted and logged by the monitor and never stops training.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Status
from watchdog.hook import config as _config
from watchdog.hook.lifecycle import crash_writer, exitcall, jobid, launcher
from watchdog.hook.monitor import Monitor
from watchdog.hook.noop import NULL_MONITOR, NullMonitor
from watchdog.hook.slot import slotfile
from watchdog.hook.slot.slotwriter import SlotWriter

log = logging.getLogger("watchdog.hook")

_lock = threading.Lock()
_active: Monitor | None = None
_process_hooks_registered = False
_fatal = crash_writer.FatalDump()  # one per process: faulthandler has one target
# The main thread's last failing sys.exit: (its crash record, the rank's steps then). Decided at atexit.
_pending_exit: tuple[dict[str, Any], int] | None = None


def install(
    *, clock: Callable[[], int] | None = None, completion_source: Any = None, **overrides: Any
) -> Monitor | NullMonitor:
    """Start monitoring this rank and return its monitor.

    Settings come from keyword ``overrides`` (names of HookConfig fields), then
    the environment (torchrun's RANK/LOCAL_RANK/WORLD_SIZE/TORCHELASTIC_* and
    WATCHDOG_*), then defaults. Disabled (WATCHDOG_ENABLED=0 or enabled=False):
    returns the shared no-op monitor and touches nothing. ``clock``: a monotonic
    nanosecond clock to use instead of time.monotonic_ns (tests, benchmarks).
    ``completion_source``: a ``watchdog.hook.completion.tracker.CompletionSource`` for
    the accelerator's completion times instead of the CUDA event source chosen
    when a GPU is there (another accelerator; tests). Raises ValueError for bad settings.

    With patch_collectives (the default) install() imports torch.distributed if
    torch is installed; without torch it patches nothing and says so at debug
    level. Call it before init_process_group to see the group being joined."""
    global _active
    running = _active
    if running is not None and running.zero_code:
        # under `watchdog run` the script's own install() gets the running monitor
        # (explicit calls on it then win over the automatic ones: watchdog.hook.zero_code.auto)
        if overrides:
            log.info("watchdog.hook install(%s) ignored: already installed by watchdog run", ", ".join(overrides))
        return running
    if not _config.is_enabled(os.environ, overrides):
        return NULL_MONITOR
    cfg = _config.load_config(os.environ, overrides, agree=jobid.agree)
    if clock is not None and not callable(clock):
        raise ValueError(f"install(clock=...): {clock!r} is not callable")
    if cfg.auto_step:
        try:
            import torch.optim.optimizer  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"auto_step (WATCHDOG_AUTO_STEP) needs torch: {exc}") from None
    with _lock:
        if _active is not None:
            raise ValueError(
                f"watchdog.hook is already installed in this process ({_active!r}); "
                "close() it first, or get it with watchdog.hook.current()"
            )
        mon = _start(cfg, clock or time.monotonic_ns, completion_source)
        _active = mon
        _register_process_hooks()
    log.info(
        "watchdog.hook installed rank=%d local_rank=%d world_size=%d launcher=%s job=%s host=%s run_id=%s "
        "slot=%s ring_capacity=%d heartbeat_interval_s=%g auto_step=%d patch_collectives=%d restart_safe_init=%d",
        cfg.rank, cfg.local_rank, cfg.world_size, launcher.detect(os.environ).launcher or "none", cfg.job,
        cfg.host, cfg.slot_run_id, mon.slot_path, cfg.ring_capacity, cfg.heartbeat_interval_s, cfg.auto_step,
        cfg.patch_collectives, cfg.restart_safe_init,
    )  # fmt: skip
    return mon


def _proc_start_ticks(pid: int) -> int:
    """The process's start in clock ticks after boot, 0 where /proc cannot say: written
    beside the start time so an agent can know the process across a step of the wall
    clock (which moves the boot time every start time is computed from)."""
    from watchdog import procstart

    try:
        return procstart.start_ticks(pid) or 0
    except Exception:  # the hook never raises into training: the agent then matches by start time alone
        return 0


def _proc_start_us(pid: int) -> tuple[int, Exception | None]:
    try:
        try:
            import psutil
        except ImportError:  # installed without dependencies (a training image): the stdlib reader
            from watchdog import procstart

            start = procstart.start_us(pid)
            if start is None:
                raise OSError(f"cannot read the start time of pid {pid} from /proc") from None
            return start, None
        return round(psutil.Process(pid).create_time() * 1e6), None
    except Exception as exc:  # the agent then cannot guard against pid reuse; say so
        return 0, exc


def _start(cfg: _config.HookConfig, clock: Callable[[], int], completion_source: Any = None) -> Monitor:
    pid = os.getpid()
    start_us, start_err = _proc_start_us(pid)
    identity = wire.Identity(
        job=cfg.job,
        host=cfg.host,
        rank=cfg.rank,
        local_rank=cfg.local_rank,
        world_size=cfg.world_size,
        pid=pid,
        proc_start_us=start_us,
        run_id=cfg.slot_run_id,
        proc_start_ticks=_proc_start_ticks(pid),
    )
    filename = wire.slot_filename(cfg.job, cfg.rank, pid)
    mapping = slotfile.open_slot(cfg.run_dir, filename, wire.slot_size(cfg.ring_capacity))
    start_ns = clock()
    slot = SlotWriter.format(mapping.mm, identity, cfg.ring_capacity, wall_ns=time.time_ns(), mono_ns=start_ns)
    mon = Monitor(cfg, slot, identity, slot_path=mapping.path, start_ns=start_ns, clock=clock, on_close=forget)
    if mapping.error is not None:
        mon.report_error("slot_file", mapping.error)  # warns once; the monitor runs on anonymous memory
    if start_err is not None:
        mon.report_error("proc_start_time", start_err)
    _sources(mon, cfg, clock, completion_source)
    try:
        mon.heartbeat.start()
    except Exception as exc:  # e.g. "can't start new thread": run without a heartbeat
        mon.report_error("heartbeat_start", exc)
    if not mon.disabled:
        mon.recorder.set_status(Status.RUNNING)
        if mapping.error is None:  # a fatal signal's stacks beside the slot, for the agent's post-mortem
            crash_writer.clear(mon.slot_path)  # an earlier process's with this pid and rank is not ours
            _fatal.enable(mon.slot_path)
    return mon


def _sources(mon: Monitor, cfg: _config.HookConfig, clock: Callable[[], int], completion_source: Any) -> None:
    """What the configuration turns on, each alone: one that fails (a torch API
    that moved) is counted by the monitor and the others still start."""
    if cfg.gpu_completion:
        try:
            from watchdog.hook.completion import tracker as completion

            source = completion_source or completion.cuda_source(clock)  # None without a GPU: nothing added anywhere
            if source is not None:
                mon.use_completions(source)
        except Exception as exc:
            mon.report_error("gpu_completion", exc)
    if cfg.patch_collectives:
        try:
            from watchdog.hook.zero_code import collectives

            collectives.patch(mon)
        except ImportError:
            log.debug("watchdog.hook torch not importable; collectives not patched")
        except Exception as exc:
            mon.report_error("patch_collectives", exc)
    if cfg.progress:
        try:
            mon.use_progress()
        except ImportError:
            log.debug("watchdog.hook torch not importable; progress not counted")
        except Exception as exc:
            mon.report_error("progress", exc)
        try:
            mon.use_frames()
        except Exception as exc:
            mon.report_error("frames", exc)
    if cfg.auto_step:
        try:
            from watchdog.hook.marks import optim

            optim.register(mon)
        except Exception as exc:
            mon.report_error("auto_step", exc)


def current() -> Monitor | NullMonitor:
    """The installed monitor, or the no-op one: libraries can mark phases without
    being handed the monitor."""
    return _active if _active is not None else NULL_MONITOR


def forget(mon: Monitor) -> None:
    """Monitor.close() calls it (handed over as ``on_close``)."""
    global _active, _pending_exit
    with _lock:
        if _active is mon:
            _active = None
            _pending_exit = None
    _fatal.disable()


def _at_exit() -> None:
    mon = _active
    if mon is not None:
        try:
            pending = _pending_exit
            # Caught if the rank stepped on after it (a try/except SystemExit around a
            # probe): only a sys.exit that nothing followed is how the process ends.
            if pending is not None and pending[1] == mon.recorder.steps:
                _exit_failed(mon, pending[0])
            mon.close()
        except Exception:
            pass


def _on_exit_call(call: str, code: Any) -> None:
    """exitcall's wrappers call this first. A nonzero exit is a failure whatever the
    hook's status would say: recorded with the exception being handled (hydra, click
    and many trainers print it and call sys.exit(1)). os._exit ends the process at
    once (from any thread): recorded now. A sys.exit can still be caught, and ends
    only its thread outside the main one: the main thread's last one is kept for atexit."""
    global _pending_exit
    mon = _active
    if mon is None:
        return
    ex = exitcall.note(call, code)
    main = threading.current_thread() is threading.main_thread()
    if call == exitcall.OS_EXIT:
        if ex.failed:
            _exit_failed(mon, _exit_record(ex))
    elif main:
        _pending_exit = (_exit_record(ex), mon.recorder.steps) if ex.failed else None


def note_system_exit(exc: SystemExit, *, failed: bool) -> None:
    """A framework hands over the SystemExit about to end the process, raised
    rather than called through sys.exit (Lightning's SIGTERMException, from its
    ``on_exception``): kept for atexit like a failing sys.exit, with itself as the
    cause. ``failed``: a failure even with status 0 (a SIGTERM the framework turned
    into a clean exit). Never raises."""
    global _pending_exit
    try:
        mon = _active
        if mon is None or threading.current_thread() is not threading.main_thread():
            return
        ex = exitcall.note(exitcall.SYS_EXIT, exc.code)
        if not (failed or ex.failed):
            return
        call = exitcall.ExitCall(f"raise {type(exc).__name__}", ex.status, ex.code)
        record = crash_writer.describe(
            type(exc), exc, exc.__traceback__, threading.current_thread().name, call.as_record()
        )
        _pending_exit = (record, mon.recorder.steps)
    except Exception:  # a post-mortem detail, never the training's exit
        pass


def _exit_record(ex: exitcall.ExitCall) -> dict[str, Any]:
    exc_type, exc, tb = exitcall.handled()
    return crash_writer.describe(exc_type, exc, tb, threading.current_thread().name, ex.as_record())


def _exit_failed(mon: Monitor, record: dict[str, Any]) -> None:
    mon.mark_failed()
    crash_writer.write_record(mon.slot_path, record)


def _after_fork_in_child() -> None:
    global _active, _lock, _pending_exit
    _lock = threading.Lock()  # another thread may have held it at the fork
    mon = _active
    _active = None
    _pending_exit = None
    _fatal.forget_in_child()
    if mon is not None:
        mon.after_fork_in_child()


def _chain_excepthook() -> None:
    """An uncaught exception ends the interpreter through atexit too; without this
    the slot would say EXITED and a crashed rank would pass for a clean finish.
    The user's (or torch's) excepthook still runs, first, unchanged."""
    previous = sys.excepthook

    def watchdog_excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        global _pending_exit
        try:
            previous(exc_type, exc, tb)
        finally:
            _pending_exit = None  # an earlier sys.exit was caught: this exception ends the process
            mon = _active
            if mon is not None and not issubclass(exc_type, KeyboardInterrupt):
                try:
                    mon.mark_failed()
                except Exception:
                    pass
                crash_writer.write(mon.slot_path, exc_type, exc, tb, threading.current_thread().name)

    sys.excepthook = watchdog_excepthook


def _chain_threading_excepthook() -> None:
    """An exception that ends another thread (a data or checkpoint thread) does
    not end the rank, but is often why it hangs or dies next: record it as the
    rank's last exception (the agent says which thread). The previous hook runs
    first, unchanged."""
    previous = threading.excepthook

    def watchdog_thread_excepthook(args: threading.ExceptHookArgs) -> None:
        try:
            previous(args)
        finally:
            mon = _active
            if mon is not None and args.exc_type is not SystemExit:
                thread = args.thread.name if args.thread is not None else "?"
                crash_writer.write(mon.slot_path, args.exc_type, args.exc_value, args.exc_traceback, thread)

    threading.excepthook = watchdog_thread_excepthook


def _register_process_hooks() -> None:
    global _process_hooks_registered
    if not _process_hooks_registered:
        _process_hooks_registered = True
        atexit.register(_at_exit)
        exitcall.patch(_on_exit_call)
        _chain_excepthook()
        _chain_threading_excepthook()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
