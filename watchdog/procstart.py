"""A process's start time from /proc, standard library only.

The hook records its own start time (identity = pid + start time, against pid
reuse) and must not need psutil for it: training images may install this
package without its dependencies. The agent reads the same field of other
processes to recognise a rank across pid namespaces (``agent/processes/nspid.py``).

Same formula as psutil's ``create_time``: boot time (``btime`` of /proc/stat)
plus field 22 of /proc/<pid>/stat (clock ticks after boot). Both are the same in
every pid namespace.
"""

from __future__ import annotations

import os


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:  # gone, or not ours to read
        return None


def stat_fields(stat: str) -> list[str]:
    """Fields 3.. of a /proc/<pid>/stat text (``[0]`` is field 3, the state). The
    command name (field 2) may hold spaces and parentheses: split after the last ')'."""
    return stat[stat.rfind(")") + 2 :].split()


def parse_start_ticks(stat: str) -> int | None:
    """Field 22 (starttime, clock ticks after boot) of a /proc/<pid>/stat text."""
    try:
        return int(stat_fields(stat)[19])
    except (IndexError, ValueError):
        return None


def ticks_to_us(ticks: int, boot_us: int, clk_tck: int | None = None) -> int:
    """Clock ticks after boot -> microseconds since the epoch (psutil's create_time formula)."""
    return boot_us + ticks * 1_000_000 // (clk_tck or clock_ticks())


def parse_boot_time(proc_stat: str) -> int | None:
    for line in proc_stat.splitlines():
        if line.startswith("btime "):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def boot_time_us(proc_root: str = "/proc") -> int | None:
    boot = parse_boot_time(read_text(os.path.join(proc_root, "stat")) or "")
    return None if boot is None else boot * 1_000_000


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """The start of ``pid`` in clock ticks after boot (no clock step moves it); None when unreadable."""
    return parse_start_ticks(read_text(os.path.join(proc_root, str(pid), "stat")) or "")


def start_us(
    pid: int, proc_root: str = "/proc", *, boot_us: int | None = None, clk_tck: int | None = None
) -> int | None:
    """Start time of ``pid`` in microseconds since the epoch; None when unreadable."""
    boot_us = boot_time_us(proc_root) if boot_us is None else boot_us
    ticks = start_ticks(pid, proc_root)
    if boot_us is None or ticks is None:
        return None
    return ticks_to_us(ticks, boot_us, clk_tck)
