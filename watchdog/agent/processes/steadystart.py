"""A process's start time in microseconds since the epoch, the same at every reading.

A rank's identity is its pid and start time. The hook records the start time when it
starts: the boot time in /proc/stat (``btime``) plus the process's start in clock ticks
after boot. ``btime`` moves whenever the realtime clock is stepped (NTP, chrony, a VM's
time sync), and psutil adds a freshly read one on every ``create_time()``. So the same
process read again after a step starts whole seconds earlier or later, and every
identity check after the step refuses it as "another process". A CI run on a loaded VM
showed it: ``btime`` was 1 s off 14 s into the run and 10 s off after 390 s, and the agent
refused all 613 signals of a restart as ``wrong_identity``, so no rank was ever stopped.

The start in clock ticks after boot (field 22 of /proc/<pid>/stat) never moves. So the
first start time read for a process, known by its pid and its start in ticks, is kept and
returned from then on. For a rank, that first reading is the agent's first match of its
slot, moments after the hook recorded its own. The key and the time come from one read of
the process's stat: a pid reused between two reads can never be given the start time of
the process that had it before (a reused pid has other ticks and is read afresh).
A dead rank's zombie is matched to its rank by the same reading (``deathcause``), and so
is a rank in another pid namespace (``nspid``): a rank that started after a step recorded
the boot time as it was then, which is what the first reading here reads too.

A hook also writes its start in ticks into its slot (``wire.H_PROC_START_TICKS``). That
closes the one window left: a step between the rank's start and the agent's first reading.
An agent restarted in a long job on a VM whose clock has stepped since reads every rank's
start seconds off the recorded one; without the ticks it refuses each rank as "another
process", and reports it dead (tests/test_agent_steadystart.py). With them: the ticks match,
so it is the same process, and once its slot is believed (the owner check) the hook's
reading becomes the first (``vouch``).

Readings are kept per /proc tree (a test's fixture tree is not the host's).
"""

from __future__ import annotations

from watchdog import procstart

MAX_KEPT = 65_536  # processes remembered; past that the oldest is forgotten (read afresh)
_FIRST: dict[tuple[str, int, int], int] = {}


def vouch(pid: int, start_ticks: int, start_us: int, proc_root: str = "/proc") -> bool:
    """Keep ``start_us`` (the start a rank's hook recorded for itself, with its ``start_ticks``)
    as the first reading of ``pid``, if ``pid`` is still that process. Only for a slot the
    agent believes (its owner is the process's user): a forged slot's claim must never
    replace what a real one's identity is checked against."""
    if start_ticks <= 0 or procstart.start_ticks(pid, proc_root) != start_ticks:
        return False
    _keep((proc_root, pid, start_ticks), start_us)
    return True


def start_us(pid: int, proc_root: str = "/proc", clk_tck: int | None = None) -> int | None:
    """The start time of ``pid`` (in our pid namespace) as first read for that process;
    None when it cannot be read (no such process). ``clk_tck``: the tree's clock-tick
    rate, when it is not this machine's (a test's tree)."""
    at = procstart.start_ticks(pid, proc_root)
    return None if at is None else first_us(pid, at, proc_root, clk_tck)


def first_us(pid: int, at: int, proc_root: str = "/proc", clk_tck: int | None = None) -> int | None:
    """The start time of the process ``pid`` that started ``at`` clock ticks after boot
    (from a stat the caller read): as first read, or read now and kept; None when the
    boot time cannot be read."""
    key = (proc_root, pid, at)
    first = _FIRST.get(key)
    if first is not None:
        return first
    boot_us = procstart.boot_time_us(proc_root)
    if boot_us is None:
        return None
    now = procstart.ticks_to_us(at, boot_us, clk_tck)
    _keep(key, now)
    return now


def _keep(key: tuple[str, int, int], start: int) -> None:
    if key not in _FIRST and len(_FIRST) >= MAX_KEPT:
        try:
            del _FIRST[next(iter(_FIRST))]
        except (KeyError, RuntimeError, StopIteration):  # another thread got there first
            pass
    _FIRST[key] = start
