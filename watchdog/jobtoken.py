"""The shared job token: its two flags and the one way every command reads them.

The token signs commands and authenticates reports, so a deployment that names
a token file and silently ends up with *no* token is the dangerous case: the
coordinator would accept unauthenticated reports, the agent refuse every signal.
Hence one behaviour for every daemon: the file wins over the inline value, and
a file that cannot be read, or holds only whitespace, is a ``FlagError`` naming
it, never "no token".
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from watchdog.flags import Flag, FlagError, dest_of, env_of

FILE = "job.token-file"
INLINE = "job.token"
INLINE_ENV = env_of(INLINE)  # WATCHDOG_JOB_TOKEN: out of argv, unlike --job.token
# Below this a token can be guessed or brute-forced against a reachable port; the
# shipped scripts make 32 random bytes (64 hex characters).
MIN_BYTES = 16


# What the token is used for, each under a key of its own derived from it (HMAC with a
# fixed label), so that what travels cannot be turned into what signs: an agent sends
# ``bearer(token)`` with every report, and whoever reads one report (a proxy log, a
# capture of plain HTTP) cannot derive ``signing_key(token)`` from it and sign a command.
BEARER_LABEL = b"rank-watchdog bearer v1"
SIGNING_LABEL = b"rank-watchdog command signing v1"


@functools.lru_cache(maxsize=8)
def _derive(token: str, label: bytes) -> str:
    return hmac.new(token.encode("utf-8"), label, hashlib.sha256).hexdigest()


def bearer(token: str) -> str:
    """The credential an agent sends as ``Authorization: Bearer`` ("" without a token)."""
    return _derive(token, BEARER_LABEL) if token else ""


def signing_key(token: str) -> bytes:
    """The HMAC key of command signatures: neither the token nor ``bearer(token)``."""
    return _derive(token, SIGNING_LABEL).encode("ascii")


def file_flag(help: str) -> Flag:
    return Flag(FILE, "", help, field="token")


def inline_flag(help: str) -> Flag:
    # argv is world-readable through ps: callers may warn with ``inline_on_argv``.
    return Flag(INLINE, "", help, secret=True, field="token")


def read(values: Mapping[str, Any]) -> str:
    """The token from ``flags.parse`` output: the file's stripped content when a
    file is named, else the inline value, stripped the same way ("" = no token):
    ``WATCHDOG_JOB_TOKEN="$(cat f)"`` with a newline must equal the file's token."""
    path = values.get(dest_of(FILE)) or ""
    if not path:
        raw = values.get(dest_of(INLINE)) or ""
        token = raw.strip()
        if raw and not token:
            raise FlagError(f"--{INLINE} (or {INLINE_ENV}) holds only whitespace: no token")
        return token
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise FlagError(f"--{FILE}={path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise FlagError(f"--{FILE}={path!r}: not UTF-8 text") from None
    if not token:
        raise FlagError(f"--{FILE}={path!r}: file holds no token (it is empty or whitespace only)")
    return token


def inline_on_argv(values: Mapping[str, Any], argv: Sequence[str] | None) -> bool:
    """Whether the token in effect is the inline one and came on the command line,
    where every local user can read it through ps (worth a warning)."""
    if not values.get(dest_of(INLINE)) or values.get(dest_of(FILE)):
        return False
    return any(a == f"--{INLINE}" or a.startswith(f"--{INLINE}=") for a in argv or ())


def too_short(token: str, listen_host: str) -> str | None:
    """The error for a token too short to protect a non-loopback listener, or None."""
    if not token or len(token.encode("utf-8")) >= MIN_BYTES or _loopback(listen_host):
        return None
    return (
        f"refusing to listen on {listen_host} with a job token of {len(token.encode('utf-8'))} bytes: anyone who "
        f"can reach the port could guess it; use at least {MIN_BYTES} random bytes (e.g. "
        f"`od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`), or listen on 127.0.0.1"
    )


def file_warning(values: Mapping[str, Any], stat_fn: Any = os.stat) -> str | None:
    """A warning when the token file can be read by every user on the host, or None."""
    path = values.get(dest_of(FILE)) or ""
    if not path:
        return None
    try:
        mode = stat_fn(path).st_mode
    except OSError:
        return None
    if mode & stat.S_IROTH:
        return (
            f"the job token file {path} is readable by every user on this host (mode {stat.filemode(mode)}): "
            f"anyone here can sign commands and send reports; chmod o-r it (0600, or 0640 for a group)"
        )
    return None


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
