"""Where slot files go when nobody says: one rule for the hook and the agent.

The shipped systemd units run the agent with ``PrivateTmp=yes``: it cannot see a
rank's ``/tmp``. So the default is the system run directory ``/run/rank-watchdog``
whenever it exists and this user may create files in it. systemd creates it at
boot (``deploy/systemd/rank-watchdog.tmpfiles.conf``, mode 3770, group
rank-watchdog; the agent's unit also declares it as its ``RuntimeDirectory=``,
preserved across agent restarts), so it is there before the first rank starts
and whether or not the agent runs. Nothing here creates it: a root-owned shared
directory with the wrong mode is worse than none.

Without it (a laptop, a user outside group rank-watchdog) the per-user fallbacks
apply, as before: ``$XDG_RUNTIME_DIR/rank-watchdog``, else
``/tmp/rank-watchdog-<uid>``. An agent run by the same user picks the same one.
A rank never fails over this: the hook falls back to anonymous memory when the
directory it chose is unusable.

Who may own it (``insecure``). The per-user fallbacks are predictable names in a
shared /tmp: another user can create ``/tmp/rank-watchdog-<uid>`` first and then
plant or swap slot files in it. So a run directory is used only if it is *owned
by the user* -- its owner is this user or root (root can do anything anyway;
the agent adds its configured training uids) -- and if others can write to it,
only with the sticky bit, which stops them removing or renaming files they do
not own. The shared ``/run/rank-watchdog`` (root:rank-watchdog, 3770) passes:
root-owned, writable only by the group, sticky. A symlink in the name's place
must itself be owned by the user or root. A group-writable directory without
the sticky bit is accepted: sharing it with a group is a deliberate choice; the
agent still believes a slot only when its file belongs to the process it names.

Pure: the environment, the uid and the access check are injected.
"""

from __future__ import annotations

import os
import stat as _stat
from collections.abc import Callable, Mapping

from watchdog import flags

SYSTEM_RUN_DIR = "/run/rank-watchdog"
RUN_DIR_ENV = flags.env_of(flags.RUN_DIR)  # WATCHDOG_RUN_DIR
# What the hook writes to and the agent reads from when WATCHDOG_RUN_DIR is unset, in words.
DEFAULT_RULE = (
    f"{SYSTEM_RUN_DIR} when it exists and is writable for the rank's user, "
    "else $XDG_RUNTIME_DIR/rank-watchdog, else /tmp/rank-watchdog-<uid>"
)


def usable(path: str, access: Callable[[str, int], bool] = os.access) -> bool:
    """A directory this user may create files in (access() follows the real uid,
    as the hook's open() does for an unprivileged rank)."""
    return access(path, os.W_OK | os.X_OK) and os.path.isdir(path)


def user_run_dir(env: Mapping[str, str], uid: int | None = None) -> str:
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "rank-watchdog")
    return f"/tmp/rank-watchdog-{os.getuid() if uid is None else uid}"


def default_run_dir(
    env: Mapping[str, str],
    *,
    uid: int | None = None,
    check: Callable[[str], bool] | None = None,
    system: str | None = None,
) -> str:
    system = SYSTEM_RUN_DIR if system is None else system
    return system if (check or usable)(system) else user_run_dir(env, uid)


def fallback_note(chosen: str, system: str | None = None, exists: Callable[[str], bool] = os.path.isdir) -> str:
    """Why a rank writing to ``chosen`` may be invisible to the host's agent, or ""."""
    system = SYSTEM_RUN_DIR if system is None else system
    if chosen == system or not exists(system):
        return ""
    return (
        f"{system} exists but this user cannot create files in it, so slots go to {chosen}: the host's agent "
        f"(systemd, PrivateTmp=yes) reads {system} and will not see this rank. Add the user to group "
        f"rank-watchdog, or set {RUN_DIR_ENV} to the agent's --run-dir"
    )


def insecure(
    path: str, *, trusted: frozenset[int] | None = None, stat: Callable = os.stat, lstat: Callable = os.lstat
) -> str:
    """Why ``path`` must not be used as a run directory, or "" (also when it does
    not exist yet: whoever creates it then owns it). ``trusted``: uids that may own
    it (default: this user and root)."""
    trusted = frozenset({os.geteuid(), 0}) if trusted is None else trusted
    try:
        link = lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if _stat.S_ISLNK(link.st_mode) and link.st_uid not in trusted:
        return f"is a symbolic link owned by uid {link.st_uid}, not by this user or root"
    try:
        st = stat(path)
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if not _stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in trusted:
        return (
            f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}) or root: another user may have "
            f"created it first to plant slot files"
        )
    if st.st_mode & _stat.S_IWOTH and not st.st_mode & _stat.S_ISVTX:
        return (
            f"is writable by every user without the sticky bit (mode {_stat.filemode(st.st_mode)}): anyone could "
            f"replace the slot files in it"
        )
    return ""
