"""Zero-code instrumentation: what ``watchdog run`` turns on inside every rank.

Each rank process of a command run by ``watchdog run`` imports our
sitecustomize (``watchdog/hook/zero_code/bootstrap``), which calls ``bootstrap()``:
decide whether this process is a rank, ``install()``, then ``enable()``:

  steps        torch's global optimizer-step post hook (every optimizer.step())
  data waits   DataLoader.__iter__ hands out a timed iterator
  collectives  torch.distributed's functions (install() patches them), and DDP's
               reducer: our comm hook is registered at the model's first forward,
               around the user's own hook when the script registers one
  checkpoints  torch.save and torch.distributed.checkpoint.save run inside
               Phase.CHECKPOINT (when no phase is already open)
  init         init_process_group (install() wraps it; restart-safe under torchrun)
  trainers     a Lightning or Transformers Trainer gets rank-watchdog's callback
               when constructed (watchdog.hook.lightning / .hf): validation and
               saves become phases, and checkpoint_restart saves the framework's
               own checkpoint; the callback then marks steps and data waits

Explicit calls win and nothing is counted twice. A script that calls install()
itself gets this monitor back; its first ``mon.step()`` removes the optimizer
hook (absorbing an automatic step already taken in that iteration, so the
counts match a run without ``watchdog run``); its first ``wrap_loader`` removes
the DataLoader patch; its first ``phase()`` the save phases; ``watch_ddp`` on a
model already hooked does nothing. A framework callback (``watchdog.hook.lightning``,
``watchdog.hook.hf``) that marks steps, data waits and phases itself calls
``hand_over`` when it is attached: the automatic sources it replaces stop before
its first mark.

Which processes are ranks (``rank_reason``, pure): one that a launcher placed
(RANK, OMPI_*, PMI_*, a Slurm step: ``watchdog.hook.lifecycle.launcher``), or the command
itself when it is a plain ``python train.py``; never a launcher process
(torchrun, accelerate, deepspeed: they would otherwise count as Slurm ranks
under ``srun torchrun``), and never a child of a rank (spawned DataLoader
workers inherit its RANK). Everything here is caught: a failure leaves the
script running uninstrumented and says so once on stderr.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from watchdog.contracts.slot import Phase
from watchdog.hook.lifecycle import launcher

log = logging.getLogger("watchdog.hook")

ROOT_PID_ENV = "WATCHDOG_RUN_PID"  # `watchdog run` execs the command: this is its pid
RANK_PID_ENV = "WATCHDOG_RUN_RANK_PID"  # set by an instrumented rank; its children inherit it
LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "accelerate.commands.launch",
        "accelerate.commands.accelerate_cli",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
    }
)
LAUNCHER_SCRIPTS = frozenset({"torchrun", "accelerate", "accelerate-launch", "deepspeed"})
_CHECKPOINT = int(Phase.CHECKPOINT)


def is_launcher(argv: Sequence[str]) -> bool:
    """``sys.orig_argv`` of a launcher process (``python -m torch.distributed.run``, ``torchrun``)."""
    args = list(argv[1:])
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        args.pop(0)  # interpreter options (-u, -X x is rare enough to ignore)
    if len(args) >= 2 and args[0] == "-m":
        return args[1] in LAUNCHER_MODULES
    return bool(args) and os.path.basename(args[0]) in LAUNCHER_SCRIPTS


def rank_reason(env: Mapping[str, str], argv: Sequence[str], pid: int) -> str | None:
    """Why this process is a rank to instrument, or None."""
    if env.get(RANK_PID_ENV, "").strip() not in ("", str(pid)):
        return None  # a child of an instrumented rank (spawned loader worker, subprocess)
    if is_launcher(argv):
        return None
    found = launcher.detect(env).launcher
    if found:
        return found
    return "command" if env.get(ROOT_PID_ENV, "").strip() == str(pid) else None


def bootstrap(env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> Any:
    """Called from the sitecustomize ``watchdog run`` puts first on PYTHONPATH.
    Returns the monitor, or None when this process is not a rank. Never raises."""
    try:
        env = os.environ if env is None else env
        argv = getattr(sys, "orig_argv", sys.argv) if argv is None else argv
        reason = rank_reason(env, argv, os.getpid())
        if reason is None:
            return None
        from watchdog.hook.lifecycle import installer as lifecycle

        mon = lifecycle.install()
        if not mon.enabled:
            return None
        os.environ[RANK_PID_ENV] = str(os.getpid())
        enable(mon)
        log.info("watchdog.hook zero-code instrumentation on (%s)", reason)
        return mon
    except Exception as exc:  # the script runs, unmonitored; say so once
        print(f"watchdog run: this process is not monitored: {exc!r}", file=sys.stderr)
        return None


def enable(mon: Any) -> None:
    """Turn every automatic source on for ``mon``; each one alone, so one that
    fails (a torch API that moved) is counted and the others still work."""
    mon.zero_code = True
    sources = (
        ("auto_step", _steps), ("auto_data", _data), ("auto_ddp", _ddp), ("auto_save", _saves),
        ("auto_trainers", _trainers),
    )  # fmt: skip
    for name, fn in sources:
        try:
            fn(mon)
        except ImportError:
            log.debug("watchdog.hook %s: torch part not importable", name)
        except Exception as exc:
            mon.report_error(name, exc)


def hand_over(mon: Any, *sources: str) -> None:
    """Switch the automatic ``sources`` ("step", "data", "save") off now: a
    framework callback marks them itself from here on. Nothing to do on a
    monitor ``watchdog run`` did not instrument, or for a source already off."""
    fn = getattr(mon, "hand_over", None)  # the no-op monitor has none: nothing is automatic there
    if fn is not None:
        fn(*sources)


def _explicit_wins(mon: Any, name: str, first: Callable[..., Any]) -> Callable[[], None]:
    """Route the monitor's ``name`` through ``first`` once: it puts the plain
    method back (no cost afterwards), undoes the automatic source, then answers.
    Returns what puts the plain method back without a call (hand_over)."""
    plain = getattr(mon, name)

    def once(*args: Any, **kwargs: Any) -> Any:
        setattr(mon, name, plain)
        return first(plain, *args, **kwargs)

    setattr(mon, name, once)

    def restore() -> None:
        if getattr(mon, name) is once:
            setattr(mon, name, plain)

    return restore


def _steps(mon: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    rec = mon.recorder
    before = rec.steps  # no counter of our own on the hot path: the recorder's count says it

    def watchdog_auto_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        rec.step()  # looked up per call: a quiet recorder's step is a no-op

    handle = register_optimizer_step_post_hook(watchdog_auto_step)
    mon.add_undo(handle.remove)

    def first_explicit_step(plain: Callable, *args: Any, **kwargs: Any) -> None:
        handle.remove()
        if rec.steps == before:
            plain(*args, **kwargs)
        # else: the optimizer hook already ended this iteration's step: counted once (its
        # loss is dropped rather than stored against the next step)

    restore = _explicit_wins(mon, "step", first_explicit_step)

    def off() -> None:
        handle.remove()
        restore()

    mon.add_automatic("step", off)


def _data(mon: Any) -> None:
    from torch.utils.data import DataLoader

    from watchdog.hook.marks.loader import TimedIterator

    rec = mon.recorder
    orig = DataLoader.__iter__
    set_batch = getattr(rec, "set_batch", None)  # the per-rank batch for batch_changed, where recorded

    def __iter__(self: Any) -> Any:
        if set_batch is not None:
            size = getattr(self, "batch_size", None)
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                set_batch(size)
        return TimedIterator(orig(self), rec)

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def undo() -> None:
        if DataLoader.__iter__ is __iter__:
            DataLoader.__iter__ = orig  # type: ignore[method-assign]

    mon.add_undo(undo)

    def first_explicit_wrap(plain: Callable, *args: Any, **kwargs: Any) -> Any:
        undo()  # the script times its own loader (or marks its waits): ours would count every wait twice
        return plain(*args, **kwargs)

    restores = [_explicit_wins(mon, name, first_explicit_wrap) for name in ("wrap_loader", "data_wait_begin")]

    def off() -> None:
        undo()
        for restore in restores:
            restore()

    mon.add_automatic("data", off)


def _ddp(mon: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from watchdog.hook.zero_code import ddp

    marks = mon.recorder.collectives
    hooked: weakref.WeakSet = weakref.WeakSet()  # DDP models whose reducer has a hook (ours or a builtin)
    # torch's private builtin-hook registration: a model with one must not get ours too
    orig_builtin = DDP._register_builtin_comm_hook  # noqa: SLF001 - torch's, patched
    orig_init, orig_register = DDP.__init__, DDP.register_comm_hook

    def register_comm_hook(self: Any, state: Any, hook: Callable) -> None:
        if getattr(hook, "watchdog_comm_hook", False) or marks.quiet:
            orig_register(self, state, hook)
        else:  # the script's own hook: time it (ours wraps it and comes back through here)
            ddp.register(marks, self, hook=hook, state=state)
        hooked.add(self)

    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        orig_builtin(self, comm_hook_type)
        hooked.add(self)  # C++ only: not timed, but no second hook may be registered

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        try:
            holder: list = []

            def first_forward(module: Any, inputs: Any) -> None:
                holder[0].remove()
                if module not in hooked and not marks.quiet:
                    try:
                        ddp.register(marks, module)
                    except Exception as exc:
                        mon.report_error("auto_ddp", exc)

            holder.append(self.register_forward_pre_hook(first_forward))
        except Exception as exc:
            mon.report_error("auto_ddp", exc)

    DDP.__init__ = __init__  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook  # type: ignore[method-assign]  # noqa: SLF001

    def undo() -> None:
        for name, orig, ours in (
            ("__init__", orig_init, __init__),
            ("register_comm_hook", orig_register, register_comm_hook),
            ("_register_builtin_comm_hook", orig_builtin, _register_builtin_comm_hook),
        ):
            if getattr(DDP, name) is ours:
                setattr(DDP, name, orig)

    mon.add_undo(undo)

    def explicit_watch_ddp(plain: Callable, model: Any, **kwargs: Any) -> None:
        _explicit_wins(mon, "watch_ddp", explicit_watch_ddp)  # every call: the model decides
        if model in hooked:
            return  # already timed (our automatic hook, or the script's own wrapped)
        plain(model, **kwargs)

    _explicit_wins(mon, "watch_ddp", explicit_watch_ddp)


def _saves(mon: Any) -> None:
    """torch.save now; torch.distributed.checkpoint's save when (if) the script
    imports it (importing it here would cost every rank ~0.8 s)."""
    import torch
    import torch.serialization

    rec = mon.recorder
    patched: list[tuple[Any, str, Any, Any]] = []
    prog = getattr(mon, "progress", None)
    only_auto: Callable[[], bool] = prog.only_auto_open if prog is not None else bool

    def as_checkpoint(orig: Callable) -> Callable:
        def save(*args: Any, **kwargs: Any) -> Any:
            # a phase is open (the script's own): it wins; inside the automatic eval, the save nests
            if rec.quiet or (rec.phase_depth and not only_auto()):
                return orig(*args, **kwargs)
            rec.phase_enter(_CHECKPOINT)
            try:
                return orig(*args, **kwargs)
            finally:
                rec.phase_exit()

        save.__wrapped__ = orig  # type: ignore[attr-defined]
        save.__doc__, save.__name__ = orig.__doc__, orig.__name__
        return save

    def patch(module: Any, name: str) -> None:
        orig = getattr(module, name, None)
        if orig is not None and not hasattr(orig, "watchdog_save"):
            ours = as_checkpoint(orig)
            ours.watchdog_save = True  # type: ignore[attr-defined]
            setattr(module, name, ours)
            patched.append((module, name, orig, ours))

    save = torch.save
    patch(torch.serialization, "save")
    if torch.save is save:
        torch.save = torch.serialization.save
        patched.append((torch, "save", save, torch.save))

    def dcp_loaded(module: Any) -> None:
        patch(module, "save")

    unhook = after_import("torch.distributed.checkpoint.state_dict_saver", dcp_loaded)

    def undo() -> None:
        unhook()
        for module, name, orig, ours in reversed(patched):
            if getattr(module, name, None) is ours:
                setattr(module, name, orig)

    mon.add_undo(undo)

    def first_explicit_phase(plain: Callable, *args: Any, **kwargs: Any) -> Any:
        undo()  # the script marks its own phases: exactly those
        return plain(*args, **kwargs)

    restore = _explicit_wins(mon, "phase", first_explicit_phase)

    def off() -> None:
        undo()
        restore()

    mon.add_automatic("save", off)


# module -> (Trainer class name, attach): the frameworks whose Trainer gets our callback
TRAINERS = {
    "lightning.pytorch.trainer.trainer": "_attach_lightning",
    "transformers.trainer": "_attach_hf",
}


def _attach_lightning(trainer: Any, mon: Any) -> None:
    from watchdog.hook import lightning

    if not any(isinstance(cb, lightning.LightningMarks) for cb in trainer.callbacks):  # the script's own wins
        # first: Lightning puts checkpoint callbacks last, and a save must follow our step
        trainer.callbacks.insert(0, lightning.WatchdogCallback(monitor=mon))


def _attach_hf(trainer: Any, mon: Any) -> None:
    from watchdog.hook import hf

    hf.watch(trainer, monitor=mon, automatic=True)


def _trainers(mon: Any) -> None:
    """Patch each framework's ``Trainer.__init__`` once its module is imported
    (importing them here would cost every rank seconds)."""
    patched: list[tuple[Any, Any, Any]] = []
    rec = mon.recorder

    def patch(module: Any) -> None:
        cls = getattr(module, "Trainer", None)
        if cls is None or getattr(cls.__init__, "watchdog_trainer", False):
            return
        orig, attach = cls.__init__, globals()[TRAINERS[module.__name__]]

        # The signature stays the Trainer's (``__wrapped__``): Lightning reads it to take
        # the arguments a script leaves out from PL_TRAINER_* (``inspect.signature(cls)``);
        # ``(*args, **kwargs)`` there made every such setting silently ignored.
        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            if not rec.quiet:
                try:
                    attach(self, mon)
                except Exception as exc:
                    mon.report_error("auto_trainers", exc)

        __init__.watchdog_trainer = True  # type: ignore[attr-defined]
        cls.__init__ = __init__
        patched.append((cls, orig, __init__))

    cancels = [after_import(name, patch) for name in TRAINERS]

    def undo() -> None:
        for cancel in cancels:
            cancel()
        for cls, orig, ours in reversed(patched):
            if cls.__init__ is ours:
                cls.__init__ = orig

    mon.add_undo(undo)


def after_import(name: str, then: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``then(module)`` once module ``name`` has executed (now, if it already
    has). Returns a function that cancels the wait."""
    if name in sys.modules:
        then(sys.modules[name])
        return lambda: None
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            cancel()
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            exec_module = loader.exec_module

            def exec_then(module: Any) -> None:
                exec_module(module)
                try:
                    then(module)
                except Exception as exc:
                    log.debug("watchdog.hook after-import %s failed: %r", name, exc)

            loader.exec_module = exec_then
            return spec

    finder = Finder()

    def cancel() -> None:
        try:
            sys.meta_path.remove(finder)
        except ValueError:
            pass

    sys.meta_path.insert(0, finder)
    return cancel
