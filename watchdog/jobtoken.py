"""The shared job token: its two flags and the one way every command reads them.

The token signs commands and authenticates reports, so a deployment that names
a token file and silently ends up with *no* token is the dangerous case: the
coordinator would accept unauthenticated reports, the agent refuse every signal.
Hence one behaviour for every daemon: the file wins over the inline value, and
a file that cannot be read, or holds only whitespace, is a ``FlagError`` naming
it, never "no token".
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from watchdog.flags import Flag, FlagError, dest_of, env_of

FILE = "job.token-file"
INLINE = "job.token"
INLINE_ENV = env_of(INLINE)  # WATCHDOG_JOB_TOKEN: out of argv, unlike --job.token


def file_flag(help: str) -> Flag:
    return Flag(FILE, "", help, field="token")


def inline_flag(help: str) -> Flag:
    # argv is world-readable through ps: callers may warn with ``inline_on_argv``.
    return Flag(INLINE, "", help, secret=True, field="token")


def read(values: Mapping[str, Any]) -> str:
    """The token from ``flags.parse`` output: the file's stripped content when a
    file is named, else the inline value ("" = no token)."""
    path = values.get(dest_of(FILE)) or ""
    if not path:
        return values.get(dest_of(INLINE)) or ""
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
