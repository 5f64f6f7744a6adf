"""Test doubles for the agent, shipped for users' tests too.

- ``RankSlot`` (from watchdog.hook.testing): a slot file written through the
  hook's own SlotWriter with forged values: identities, pids, heartbeats,
  steps, collectives, phases, statuses. ``identity`` makes the Identity.
- ``snapshot`` / ``step_record``: decoded slots built in memory, for pure tests.
- ``FakeProcess`` / ``FakeProcesses``: psutil.Process look-alikes with
  scripted failures; ``FakeNvml``: enough of ``pynvml``, with faults on demand.
- ``python -m watchdog.agent.testing --run-dir D --job J --rank R --world-size W``
  runs a fake rank process (``fake_rank``): it "trains" (steps, collectives,
  heartbeats) into its slot until killed, or for ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import psutil

from watchdog.contracts import slot as wire
from watchdog.hook.slot.slotwriter import SlotWriter
from watchdog.hook.testing import RankSlot

__all__ = [
    "FakeNvml", "FakeProcess", "FakeProcesses", "RankSlot", "fake_rank", "identity", "snapshot", "step_record",
]  # fmt: skip

# -- slots ---------------------------------------------------------------------------


def identity(
    job: str = "job",
    rank: int = 0,
    world_size: int = 1,
    *,
    pid: int | None = None,
    proc_start_us: int | None = None,
    local_rank: int | None = None,
    host: str = "h",
) -> wire.Identity:
    """An Identity for this process by default (pid and its real start time)."""
    pid = os.getpid() if pid is None else pid
    if proc_start_us is None:
        proc_start_us = int(psutil.Process(pid).create_time() * 1e6)
    return wire.Identity(
        job=job,
        host=host,
        rank=rank,
        local_rank=rank if local_rank is None else local_rank,
        world_size=world_size,
        pid=pid,
        proc_start_us=proc_start_us,
    )


def snapshot(
    ident: wire.Identity,
    words: dict[int, int] | None = None,
    *,
    wall_ns: int = 1_000_000_000_000,
    mono_ns: int = 1_000_000_000,
    path: str = "/run/x.slot",
    records: Iterable[wire.Record] = (),
    torn: bool = False,
    status: wire.Status = wire.Status.RUNNING,
) -> wire.SlotSnapshot:
    """A real, decoded SlotSnapshot built in memory by the hook's SlotWriter, for
    pure tests: seqlocked ``words`` in one bracket, the others stored alone.
    ``records`` and ``torn`` are attached as given (the ring is not written)."""
    wr = SlotWriter.format(bytearray(wire.slot_size(8)), ident, 8, wall_ns=wall_ns, mono_ns=mono_ns)
    wr.put(wire.H_STATUS, int(status))
    words = words or {}
    wr.write((i, v) for i, v in words.items() if wire.seqlocked(i))
    for i, v in words.items():
        if not wire.seqlocked(i):
            wr.put(i, v)
    header = wire.decode_header(wr.copy()[: wire.RING_OFFSET])
    return wire.SlotSnapshot(path=path, header=header, records=tuple(records), torn=torn)


def step_record(
    index: int,
    step: int,
    step_ns: int,
    data_ns: int = 0,
    coll_ns: int = 0,
    t_ns: int = 0,
    phase: wire.Phase = wire.Phase.TRAIN,
    *,
    coll_bytes: int = 0,
    split: tuple[int, int, int, int] = (0, 0, 0, 0),
) -> wire.Record:
    """A STEP_END record; ``split``: forward, backward, optimizer, h2d ns."""
    return wire.Record(
        index=index,
        kind=int(wire.RecordKind.STEP_END),
        t_ns=t_ns,
        step=step,
        payload=(step_ns, data_ns, coll_ns, 1, 0, int(phase), 1, coll_bytes, *split),
    )


# -- a fake rank process -------------------------------------------------------------


def _exit(*_: Any) -> None:
    raise SystemExit(0)


def fake_rank(argv: list[str] | None = None) -> int:
    """Write a slot like a training rank's hook would, in real time."""
    ap = argparse.ArgumentParser(description="fake rank: writes a slot like the hook would")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--job", default="job")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=0, help="exit cleanly after this many (0 = until killed)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit)
    wr = RankSlot(args.run_dir, identity(args.job, args.rank, args.world_size))
    wr.update({wire.H_PG_STATE: int(wire.PgState.JOINED), wire.H_PG_CHANGE_NS: time.monotonic_ns()})
    wr.status(wire.Status.RUNNING)
    step_ns = int(args.step_seconds * 1e9)
    seq, done = 0, 0
    try:
        while not args.steps or done < args.steps:
            t0 = time.monotonic_ns()
            time.sleep(args.step_seconds * 0.1)  # "data"
            seq += 1
            wr.enter_collective(seq)
            time.sleep(args.step_seconds * 0.3)  # "all-reduce"
            wr.exit_collective()
            wr.heartbeat()
            time.sleep(max(0.0, (t0 + step_ns - time.monotonic_ns()) / 1e9))
            wr.step(time.monotonic_ns() - t0, step_ns // 10, step_ns * 3 // 10)
            done += 1
        wr.status(wire.Status.EXITED)
    except (SystemExit, KeyboardInterrupt):
        pass
    return 0


# -- processes -----------------------------------------------------------------------


@dataclass
class FakeProcess:
    """psutil.Process look-alike. ``fail_at``: raise ``exc`` from the n-th method
    call (1-based, counted over every method), e.g. a process that vanishes mid-read."""

    pid: int
    create_time_s: float
    status_: str = psutil.STATUS_SLEEPING
    cpu: tuple[float, float] = (1.0, 0.5)
    rss: int = 50 << 20
    running: bool = True
    fail_at: int | None = None
    exc: Exception | None = None
    calls: int = field(default=0, init=False)

    def _tick(self) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise self.exc or psutil.NoSuchProcess(self.pid)

    def create_time(self) -> float:
        self._tick()
        return self.create_time_s

    def is_running(self) -> bool:
        self._tick()
        return self.running

    @contextlib.contextmanager
    def oneshot(self) -> Iterator[None]:
        yield

    def status(self) -> str:
        self._tick()
        return self.status_

    def cpu_times(self) -> SimpleNamespace:
        self._tick()
        return SimpleNamespace(user=self.cpu[0], system=self.cpu[1])

    def memory_info(self) -> SimpleNamespace:
        self._tick()
        return SimpleNamespace(rss=self.rss)


class FakeProcesses:
    """A ``factory(pid)`` for ProcessTable over a dict of FakeProcess; unknown pid = gone."""

    def __init__(self, *procs: FakeProcess) -> None:
        self.procs = {p.pid: p for p in procs}

    def __call__(self, pid: int) -> FakeProcess:
        if pid not in self.procs:
            raise psutil.NoSuchProcess(pid)
        return self.procs[pid]


# -- NVML ----------------------------------------------------------------------------


class FakeNvml:
    """Enough of ``pynvml`` for the accelerator collector: ``gpus`` is a list of
    dicts of device values; ``xid`` maps a device index to XID codes still to
    deliver; ``unsupported`` names functions that raise NVMLError_NotSupported;
    ``init_error`` makes nvmlInit raise that NVML error code."""

    def __init__(
        self,
        gpus: list[dict],
        *,
        init_error: int | None = None,
        xid: dict[int, list[int]] | None = None,
        unsupported: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        import pynvml

        self._p = pynvml
        self.NVMLError = pynvml.NVMLError
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus, self.init_error = gpus, init_error
        self.xid = {i: list(v) for i, v in (xid or {}).items()}
        self.unsupported = set(unsupported)
        self.calls: dict[str, int] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.unsupported:
            raise self._p.NVMLError(self._p.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise self._p.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _get(self, name: str, h: int, key: str) -> Any:
        self._call(name)
        return self.gpus[h][key]

    def nvmlDeviceGetName(self, h: int) -> Any:
        return self._get("nvmlDeviceGetName", h, "name")

    def nvmlDeviceGetUUID(self, h: int) -> Any:
        return self._get("nvmlDeviceGetUUID", h, "uuid")

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> Any:
        return self._get("nvmlDeviceGetTemperature", h, "temp")

    def nvmlDeviceGetPowerUsage(self, h: int) -> Any:
        return self._get("nvmlDeviceGetPowerUsage", h, "power_mw")

    def nvmlDeviceGetClockInfo(self, h: int, clk: int) -> Any:
        return self._get("nvmlDeviceGetClockInfo", h, "sm_mhz")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> Any:
        return self._get("nvmlDeviceGetCurrentClocksEventReasons", h, "throttle")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.gpus[h]["util"], memory=self.gpus[h]["mem_util"])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=self.gpus[h]["mem_used"], total=self.gpus[h]["mem_total"], free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in self.gpus[h].get("pids", ())]

    def nvmlEventSetCreate(self) -> dict[str, list[int]]:
        self._call("nvmlEventSetCreate")
        return {"devices": []}

    def nvmlDeviceRegisterEvents(self, h: int, types: int, es: dict[str, list[int]]) -> None:
        self._call("nvmlDeviceRegisterEvents")
        es["devices"].append(h)

    def nvmlEventSetWait_v2(self, es: dict[str, list[int]], timeout_ms: int) -> SimpleNamespace:
        self._call("nvmlEventSetWait_v2")
        for h in es["devices"]:
            if self.xid.get(h):
                return SimpleNamespace(
                    device=h, eventType=self._p.nvmlEventTypeXidCriticalError, eventData=self.xid[h].pop(0)
                )
        raise self._p.NVMLError(self._p.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, es: dict[str, list[int]]) -> None:
        self._call("nvmlEventSetFree")


if __name__ == "__main__":
    raise SystemExit(fake_rank())


class NoPin:
    """A ``pidpin.Pin`` stand-in for fake pids: nothing pinned, so ``Actions``
    re-reads the (injected) start time after a dump instead."""

    gone = False
    pinned = False

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def exited(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def __enter__(self) -> NoPin:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
