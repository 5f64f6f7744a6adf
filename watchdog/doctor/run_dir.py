"""The run directory: who owns it, who may write it (rundir.py's rules)."""

from __future__ import annotations

import os
import stat

from watchdog import flags, rundir

from .check import AGENT, FIX, OK, TRAINING, WARN, Host, Result


def path_of(host: Host) -> str:
    return host.run_dir or rundir.default_run_dir(host.env)


class RunDir:
    name = "run_dir"
    roles = frozenset({AGENT, TRAINING})

    def check(self, host: Host) -> Result:
        path = path_of(host)
        if not os.path.lexists(path):
            if path == rundir.SYSTEM_RUN_DIR:
                return Result(
                    self.name,
                    FIX,
                    f"{path} does not exist",
                    "install deploy/systemd/rank-watchdog.tmpfiles.conf and run `systemd-tmpfiles --create`",
                )
            return Result(self.name, OK, f"{path} does not exist yet; the first rank or the agent creates it")
        bad = rundir.insecure(path, trusted=frozenset({host.euid, 0}) | host.trusted_uids)
        if bad:
            st = os.lstat(path)
            return Result(
                self.name,
                FIX,
                f"{path} {bad}",
                f"remove it, or `chown {host.euid} {path} && chmod {'3770' if st.st_mode & stat.S_ISVTX else '0700'} "
                f"{path}`; or set --{flags.RUN_DIR} to a directory you own",
            )
        if not rundir.usable(path):
            return Result(
                self.name,
                FIX,
                f"{path} exists but this user (uid {host.euid}) cannot create files in it",
                "add the ranks' user to group rank-watchdog, "
                f"or set {rundir.RUN_DIR_ENV} to a directory it owns (the agent's --{flags.RUN_DIR} too)",
            )
        mode = stat.filemode(os.stat(path).st_mode)
        note = rundir.fallback_note(path)
        if note:
            return Result(self.name, WARN, f"{path} ({mode}); {note}", "add this user to group rank-watchdog")
        return Result(self.name, OK, f"{path} ({mode}) owned by a trusted user, writable here")
