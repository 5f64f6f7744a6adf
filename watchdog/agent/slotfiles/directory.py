"""The run directory the slot files are listed from. It is listed only while it is
safe: a directory anyone could have created or can swap files in is refused (its
slots could be anyone's), checked again whenever the directory itself changes. A
refusal, an unreadable directory and a long stretch without a rank to export are
each said once when they start, and once when they end."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from watchdog import flags, rundir

NO_SLOTS_AFTER_NS = 60_000_000_000  # this long without a rank to export: say where we look, once


class SlotDirectory:
    def __init__(
        self,
        run_dir: str,
        *,
        lister: Callable[[str, int], dict[str, int]],
        check_dir: Callable[[str], str] | None,
        trusted: frozenset[int],
        log: Any,
    ) -> None:
        self.run_dir = run_dir
        self._list, self._trusted, self._log = lister, trusted, log
        self._check = check_dir or (lambda path: rundir.insecure(path, trusted=self._dir_owners()))
        self._dir_key: tuple[int, int, int] | None = None  # (ino, uid, mode) of the run dir last found safe
        self._dir_refused = ""
        self._dir_missing = False
        self._empty_since_ns: int | None = None  # start of the current stretch without a rank to export
        self._said_empty = False

    def _dir_owners(self) -> frozenset[int]:
        return frozenset({os.geteuid(), 0}) | self._trusted

    def _dir_safe(self) -> bool:
        """A run dir anyone could have created or can swap files in is not read: its
        slots could be anyone's. Checked again whenever the directory itself changes."""
        try:
            st = os.stat(self.run_dir)
        except OSError:
            return True  # missing: the listing says so
        key = (st.st_ino, st.st_uid, st.st_mode)
        if key == self._dir_key:
            return True
        why = self._check(self.run_dir)
        if why:
            if why != self._dir_refused:
                self._log.error(
                    "run dir refused",
                    run_dir=self.run_dir,
                    reason=why,
                    detail="slot files here are not read: anyone able to create or replace them could "
                    "make this agent report, dump or signal arbitrary processes",
                )
            self._dir_refused, self._dir_key = why, None
            return False
        if self._dir_refused:
            self._log.info("run dir accepted", run_dir=self.run_dir)
        self._dir_refused, self._dir_key = "", key
        return True

    def entries(self, now_ns: int) -> dict[str, int]:
        """path -> inode of the slot files to read now; none while the directory is
        refused or unreadable."""
        if not self._dir_safe():
            return {}
        try:
            entries = self._list(self.run_dir, now_ns)
        except OSError as exc:
            if not self._dir_missing:
                self._log.warning("run dir unreadable", run_dir=self.run_dir, error=str(exc))
            self._dir_missing = True
            return {}
        if self._dir_missing:
            self._log.info("run dir readable", run_dir=self.run_dir)
        self._dir_missing = False
        return entries

    def check_empty(self, now_mono_ns: int, files: int, tracked: int, counts: Callable[[], dict[str, int]]) -> None:
        """No silent no-data: an agent that has had no rank to export for a while says
        once where it looks and why ranks may be writing elsewhere. ``tracked``: the
        slots the tracker follows; ``counts``: its files by state, read only to say so."""
        if tracked:
            if self._said_empty:
                self._log.info("rank slots found", run_dir=self.run_dir, slots=tracked)
            self._empty_since_ns, self._said_empty = None, False
            return
        if self._empty_since_ns is None:
            self._empty_since_ns = now_mono_ns
        if self._said_empty or now_mono_ns - self._empty_since_ns < NO_SLOTS_AFTER_NS:
            return
        self._said_empty = True
        skipped = {k: n for k, n in counts().items() if n}
        self._log.warning(
            "no rank slots found",
            run_dir=self.run_dir,
            waited_s=round((now_mono_ns - self._empty_since_ns) / 1e9),
            files=files,
            skipped=skipped,
            detail=f"ranks write their slot files to {rundir.RUN_DIR_ENV} or, when it is unset, to the default: "
            f"{rundir.DEFAULT_RULE} (for this agent's user: {rundir.default_run_dir(os.environ)}). A rank with "
            f"another {rundir.RUN_DIR_ENV}, a container without this directory mounted, a user who cannot "
            f"write here, or a private /tmp puts its slots where this agent cannot see them; its hook logs "
            f"the path it writes (logger watchdog.hook). Point --{flags.RUN_DIR} and the ranks at one "
            f"directory; watchdog_agent_slots shows what this agent finds",
        )
