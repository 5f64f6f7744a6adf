"""Each job's coordinator, found in the run directory: one site-wide agent (a systemd
unit on a shared Slurm node) serving the per-job coordinators of every job there.

A job announces its coordinator by writing its base URL into
``<run-dir>/<job>.coordinator`` (deploy/slurm/train.sbatch does, once the coordinator
listens). The run directory is shared by every user of the node, so the file is
believed only when the user that owns it owns every slot file of that job here:
another user can neither redirect a job's reports nor, by joining the job's name
with a slot of their own, take them (the job then goes unreported, and the log
says why). A job without a believable file is still exported on /metrics; its
reports wait until the file appears.

Pure but for the injected ``lstat`` and ``read``: tests drive it with a fake tree.
"""

from __future__ import annotations

import os
import stat as _stat
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from watchdog import logs
from watchdog.agent.slots import LocalRank

SUFFIX = ".coordinator"
MAX_BYTES = 4096


def path_of(run_dir: str, job: str) -> str:
    return os.path.join(run_dir, job + SUFFIX)


def parse_url(text: str) -> str:
    """The file's URL, or "" when it is not one (an http(s) URL with a host)."""
    line = text.strip().splitlines()[0].strip().rstrip("/") if text.strip() else ""
    u = urllib.parse.urlsplit(line)
    return line if u.scheme in ("http", "https") and u.hostname else ""


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, MAX_BYTES).decode("utf-8", "replace")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Found:
    url: str
    why_not: str  # "" when the URL is believed


def examine(path: str, ranks: Sequence[LocalRank], lstat: Callable = os.lstat, read: Callable = _read) -> Found:
    """The job's coordinator URL from ``path``, or why there is none."""
    try:
        st = lstat(path)
    except FileNotFoundError:
        return Found("", "no coordinator file yet")
    except OSError as exc:
        return Found("", f"cannot be examined: {exc.strerror or exc}")
    if not _stat.S_ISREG(st.st_mode):
        return Found("", "is not a regular file")
    owners = {r.uid for r in ranks}
    if owners != {st.st_uid}:
        return Found(
            "", f"is owned by uid {st.st_uid}, the job's slot files by {sorted(owners)}: believed only when all are one"
        )
    try:
        url = parse_url(read(path))
    except OSError as exc:
        return Found("", f"cannot be read: {exc.strerror or exc}")
    return Found(url, "" if url else "holds no http(s) URL")


class Discovery:
    """``url_of(job, ranks)`` for the sender: the job's coordinator base URL, or ""."""

    def __init__(self, run_dir: str, *, lstat: Callable = os.lstat, read: Callable = _read, log=None) -> None:
        self._run_dir, self._lstat, self._read = run_dir, lstat, read
        self._log = log or logs.get("watchdog.agent.discovery")
        self._last: dict[str, Found] = {}

    def __call__(self, job: str, ranks: Sequence[LocalRank]) -> str:
        if not job or job.startswith(".") or "/" in job or "\0" in job:
            found = Found("", "job name unusable as a file name")
        else:
            found = examine(path_of(self._run_dir, job), ranks, self._lstat, self._read)
        if self._last.get(job) != found:  # log state changes, not ticks
            self._last[job] = found
            if found.url:
                self._log.info("coordinator found", job=job, url=found.url)
            else:
                self._log.info("coordinator not found", job=job, path=path_of(self._run_dir, job), reason=found.why_not)
        return found.url
