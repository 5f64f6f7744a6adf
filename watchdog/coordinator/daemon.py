"""The running coordinator: HTTP server thread + tick thread around a
``Coordinator``. The tick thread is the one place that reads the clock for
detection: once per tick, monotonic and wall together.

Used by ``main`` and by in-process tests (start on port 0, read ``address``).
"""

from __future__ import annotations

import os
import threading
import time

from prometheus_client import CollectorRegistry, ProcessCollector

from .. import logs, webconfig
from ..contracts.journal.lifecycle import ConfigRecord, StartRecord, StopRecord
from ..contracts.journal.performance import GoodputRecord
from .config import Config, loggable
from .gcpolicy import GcPolicy
from .intake.server import bound_address, make_server
from .journal import lock as journallock
from .journal.jsonl import Journal
from .own_stall import is_stall
from .service import Coordinator


def _clock() -> tuple[float, float]:
    return time.time(), time.monotonic()


def write_address_file(path: str, address: str) -> None:
    """Atomically, so a launcher polling for it never reads half an address."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(address + "\n")
    os.replace(tmp, path)


def stale_after(tick_s: float) -> float:
    """How long without a finished tick /healthz calls the loop stale: ten ticks,
    and never under 30 s (a tick at 16,384 ranks takes ~0.5 s, a full collection
    about as long; a liveness probe must not kill a coordinator that is merely busy)."""
    return max(30.0, 10.0 * tick_s)


class Daemon:
    def __init__(
        self,
        cfg: Config,
        registry: CollectorRegistry | None = None,
        *,
        own_process: bool = False,
        stale_after_s: float | None = None,
        web: webconfig.WebConfig | None = None,
    ) -> None:
        """``own_process``: the daemon is the whole process (``main``), so it may
        manage the garbage collector (``gcpolicy``); never inside someone else's.
        ``stale_after_s``: see ``stale_after`` (tests pass less). ``web``: the loaded
        ``--web.config.file`` (read here when not given)."""
        web = web if web is not None else webconfig.load(cfg.web_config)
        self.cfg = cfg
        self._stale_after_s = stale_after(cfg.tick_s) if stale_after_s is None else stale_after_s
        self._ticked_at: float | None = None  # monotonic end of the last tick; None: replay or first tick pending
        self._own_process = own_process
        self.log = logs.get("watchdog.coordinator")
        self._lock_fd = journallock.acquire(
            cfg.journal
        )  # before the journal opens: a second coordinator writes nothing
        try:
            self.journal = Journal(cfg.journal, _clock, cfg.token)  # the token signs every line
            self.coordinator = Coordinator(cfg, self.journal, registry, wall_clock=time.time)
            if own_process:  # the standard process_* series; in someone else's process they would be its
                ProcessCollector(registry=self.coordinator.registry)
            self._gc = GcPolicy(time.monotonic(), enabled=own_process)
            self.server = make_server(
                cfg.listen[0],
                cfg.listen[1],
                self.coordinator,
                cfg.token,
                cfg.max_body_bytes,
                after_report=self._gc.after_report,  # a report's objects out of the collector's sight (gcpolicy.py)
                event_loop=cfg.event_loop,
                unhealthy=self.unhealthy,
                unready=self.unready,
                web=web,
            )
        except BaseException:  # could not start: the journal is free again
            journallock.release(self._lock_fd)
            raise
        self.address = bound_address(self.server)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Daemon:
        self.journal.write(
            StartRecord(
                pid=os.getpid(),
                address=self.address,
                job=self.cfg.job,
                run_id=self.cfg.run_id,
                world_size=self.cfg.world_size,
                event_loop=self.server.event_loop,
            )
        )
        self.journal.write(ConfigRecord(config=loggable(self.cfg)))
        # Before the first report or tick: a restarted coordinator carries on the job's decisions.
        self.coordinator.recover(time.monotonic(), time.time())
        self._threads = [
            threading.Thread(
                target=self.server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="watchdog-coordinator-http",
                daemon=True,
            ),
            threading.Thread(target=self._tick_loop, name="watchdog-coordinator-tick", daemon=True),
        ]
        for t in self._threads:
            t.start()
        if self.cfg.address_file:
            write_address_file(self.cfg.address_file, self.address)
        self.log.info("listening", address=self.address, journal=self.cfg.journal)
        return self

    def unhealthy(self) -> str:
        """Why /healthz fails, or "": the tick loop (detection, actions) has not
        finished a tick for too long, so the daemon is up but watching nothing."""
        at = self._ticked_at
        if at is None:
            return ""  # still starting: /readyz says so
        age = time.monotonic() - at
        return (
            f"no tick finished for {age:.0f} s (limit {self._stale_after_s:g} s)" if age > self._stale_after_s else ""
        )

    def unready(self) -> str:
        """Why /readyz fails, or "": the journal is replayed and one tick has run."""
        return "" if self._ticked_at is not None else "replaying the journal or first tick pending"

    def _tick_loop(self) -> None:
        interval = self.cfg.tick_s
        next_at = time.monotonic()
        last = None
        gc_policy = self._gc
        while not self._stop.is_set():
            now, wall = time.monotonic(), time.time()
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                if last is not None and is_stall(now - last, interval):  # we were stopped, not the hosts
                    self.coordinator.stalled(now, now - last, wall)
                last = now
                gc_policy.before_tick()  # the tick's collections walk only its own objects (gcpolicy.py)
                with self.coordinator.journal.batch():  # one fsync for all the tick journals
                    self.coordinator.tick(now, wall)
            except Exception as exc:  # noqa: BLE001 - detectors are isolated; this is a bug elsewhere, keep ticking
                self.log.error("tick_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
            self.coordinator.metrics.tick.observe(time.perf_counter() - t0)
            self._ticked_at = time.monotonic()
            self.coordinator.metrics.tick_cpu.observe(time.thread_time() - c0)
            g0 = time.perf_counter()
            full = gc_policy.after_tick(now)
            if full is not None:  # outside the tick's histograms: it stops the request loop too
                took = time.perf_counter() - g0
                self.coordinator.metrics.gc_full.set(took)
                self.log.info(
                    "gc_full_collection",
                    seconds=round(took, 3),
                    frozen=full.frozen,
                    unreachable=full.unreachable,
                    next_in_s=full.next_in_s,
                )
            # Fixed cadence; after a stall (suspended VM) skip missed ticks instead of bursting.
            next_at = max(next_at + interval, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self, reason: str = "stopped") -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        for t in self._threads:
            t.join(timeout=5.0)
        active = [{"kind": k, "ranks": list(r)} for k, r in self.coordinator.active]
        try:  # where the run's time went, once more at the end
            self.journal.write(GoodputRecord(extra=self.coordinator.goodput_record(final=True)))
        except Exception as exc:  # the stop record matters more
            self.log.error("goodput_summary_failed", error=f"{type(exc).__name__}: {exc}")
        self.journal.write(StopRecord(reason=reason, active_findings=active))
        self.journal.close()
        journallock.release(self._lock_fd)
        self.log.info("stopped", reason=reason)
