"""Which slot files are in the run directory (path -> inode), cheaply."""

from __future__ import annotations

import os
from collections.abc import Callable

from watchdog.contracts import slot as wire


def list_slots(run_dir: str) -> dict[str, int]:
    """path -> inode of the slot files in ``run_dir`` and in its subdirectories, one
    level down: a directory per job, owned by the job's user (Slurm's Prolog,
    deploy/slurm/prolog.sh), which a site-wide agent reads through its group (d_ino
    and d_type from getdents: no stat). A slot there is believed as one at the top:
    only when its file belongs to the process it names. Raises FileNotFoundError
    when ``run_dir`` does not exist; a subdirectory gone or unreadable is skipped.
    (CachedLister sees a new slot in a subdirectory at its periodic rescan.)"""
    out, below = {}, []
    with os.scandir(run_dir) as it:
        for e in it:
            if e.name.endswith(wire.SLOT_SUFFIX):
                out[e.path] = e.inode()
            elif e.is_dir(follow_symlinks=False):
                below.append(e.path)
    for sub in below:
        try:
            with os.scandir(sub) as it:
                out.update({e.path: e.inode() for e in it if e.name.endswith(wire.SLOT_SUFFIX)})
        except OSError:
            continue
    return out


class CachedLister:
    """``list_slots`` only when the directory changed: creating, deleting or renaming
    an entry bumps its mtime, and a stat is far cheaper than a scan. A full scan
    every ``rescan_s`` anyway covers filesystems with coarse timestamps."""

    def __init__(
        self, rescan_s: float = 1.0, scan: Callable[[str], dict[str, int]] = list_slots, stat: Callable = os.stat
    ) -> None:
        self._rescan_ns, self._scan, self._stat = int(rescan_s * 1e9), scan, stat
        self._key: tuple | None = None
        self._at = 0
        self._entries: dict[str, int] = {}

    def __call__(self, run_dir: str, now_ns: int) -> dict[str, int]:
        st = self._stat(run_dir)
        key = (run_dir, st.st_ino, st.st_mtime_ns)
        if key != self._key or now_ns - self._at >= self._rescan_ns:
            self._entries = self._scan(run_dir)
            self._key, self._at = key, now_ns
        return self._entries
