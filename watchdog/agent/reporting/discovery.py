"""Each job's coordinator, found in the run directory: one site-wide agent (a systemd
unit on a shared Slurm node) serving the per-job coordinators of every job there.

A job announces its coordinator by writing its base URL into ``<job>.coordinator``
beside its slot files (deploy/slurm/train.sbatch does, once the coordinator listens),
and may put its own token beside it in ``<job>.token`` (readable by the agent's
group, never by every user): reports to that coordinator and the commands in its
replies then use that token, not the agent's. A run directory may be shared by
every user of the node, so the files are believed only when the user that owns
them owns every slot file of that job here: another user can neither redirect a
job's reports nor, by joining the job's name with a slot of their own, take them
(such a slot is refused once a live rank of the job's user is seen, agent/slotfiles/tracker.py;
should it come first, the job goes unreported, and the log says why). A job without a believable
file is still exported on /metrics; its reports wait until the file appears.

Slot files are in the run directory or one level below it (a directory per job,
owned by the job's user: Slurm's Prolog, deploy/slurm/prolog.sh); the files are
looked for beside them. Pure but for the injected ``lstat`` and ``read``: tests
drive it with a fake tree.
"""

from __future__ import annotations

import os
import stat as _stat
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from watchdog import logs
from watchdog.agent.slotfiles.local_rank import LocalRank

SUFFIX = ".coordinator"
TOKEN_SUFFIX = ".token"
MAX_BYTES = 4096


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
    token: str = field(default="", repr=False)  # "" = the agent's own


def _owned(path: str, ranks: Sequence[LocalRank], lstat: Callable) -> tuple[Any, str]:
    """(stat, "") for a regular file owned by the one user owning all ``ranks``, else (None, why)."""
    try:
        st = lstat(path)
    except FileNotFoundError:
        return None, "no such file yet"
    except OSError as exc:
        return None, f"cannot be examined: {exc.strerror or exc}"
    if not _stat.S_ISREG(st.st_mode):
        return None, "is not a regular file"
    owners = {r.uid for r in ranks}
    if owners != {st.st_uid}:
        return (
            None,
            f"is owned by uid {st.st_uid}, the job's slot files by {sorted(owners)}: believed only when all are one",
        )
    return st, ""


def examine(path: str, ranks: Sequence[LocalRank], lstat: Callable = os.lstat, read: Callable = _read) -> Found:
    """The job's coordinator URL from ``path`` (and its token from the file beside it), or why there is none."""
    st, why = _owned(path, ranks, lstat)
    if st is None:
        return Found("", why)
    try:
        url = parse_url(read(path))
    except OSError as exc:
        return Found("", f"cannot be read: {exc.strerror or exc}")
    if not url:
        return Found("", "holds no http(s) URL")
    token_path = path.removesuffix(SUFFIX) + TOKEN_SUFFIX
    st, why = _owned(token_path, ranks, lstat)
    if st is None:
        return Found(url, "") if why == "no such file yet" else Found("", f"{token_path} {why}")
    if st.st_mode & 0o004:
        return Found("", f"{token_path} is readable by every user: not a secret")
    try:
        token = read(token_path).strip()
    except OSError as exc:
        return Found("", f"{token_path} cannot be read: {exc.strerror or exc}")
    return Found(url, "", token) if token else Found("", f"{token_path} is empty")


class Discovery:
    """``url_of(job, ranks)`` for the sender: the job's coordinator base URL, or "";
    ``token_of(job)``: the token that goes with it ("" = the agent's own)."""

    def __init__(self, run_dir: str, *, lstat: Callable = os.lstat, read: Callable = _read, log: Any = None) -> None:
        self._run_dir, self._lstat, self._read = run_dir, lstat, read
        self._log = log or logs.get("watchdog.agent.discovery")
        self._last: dict[str, Found] = {}

    def __call__(self, job: str, ranks: Sequence[LocalRank]) -> str:
        dirs = {os.path.dirname(r.path) for r in ranks}
        path = os.path.join(dirs.pop() if len(dirs) == 1 else self._run_dir, job + SUFFIX)
        if not job or job.startswith(".") or "/" in job or "\0" in job:
            found = Found("", "job name unusable as a file name")
        elif dirs:
            found = Found("", "the job's slot files are in several directories")
        else:
            found = examine(path, ranks, self._lstat, self._read)
        if self._last.get(job) != found:  # log state changes, not ticks
            self._last[job] = found
            if found.url:
                self._log.info("coordinator found", job=job, url=found.url, own_token=bool(found.token))
            else:
                self._log.info("coordinator not found", job=job, path=path, reason=found.why_not)
        return found.url

    def token_of(self, job: str) -> str:
        found = self._last.get(job)
        return found.token if found else ""
