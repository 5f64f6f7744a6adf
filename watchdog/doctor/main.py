"""``watchdog doctor``: check this host before a job. Reads the daemons' flags
and ``WATCHDOG_*`` environment (run it with the agent's or coordinator's
environment file). Exit 0: nothing to fix; 1: something to fix; 2: bad flags."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from watchdog import flags, jobtoken
from watchdog.coordinator.config import CONFIG_FLAGS
from watchdog.flags import Flag

from .check import FIX, ROLES, WARN, Host
from .runner import exit_code, run

JOURNAL_FLAG = next(f for f in CONFIG_FLAGS if f.name == "journal")  # the coordinator's own flag
DESCRIPTION = "Pre-flight checks of this host for an agent, a training job or a coordinator, each with its fix."
JSON = "json"
# Switches (no value), beside the flags: (name, what it does).
SWITCHES = ((JSON, "print a JSON report"),)
MARK = {"ok": "ok  ", WARN: "warn", FIX: "FIX "}


def _roles(text: str) -> frozenset[str]:
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    unknown = roles - set(ROLES)
    if not roles or unknown:
        raise ValueError(f"roles are {', '.join(ROLES)} (comma-separated)")
    return roles


def _uids(text: str) -> frozenset[int]:
    return frozenset(int(u) for u in text.split(",") if u.strip())


FLAGS: tuple[Flag, ...] = (
    Flag("role", "agent,training", f"what this host runs: {', '.join(ROLES)} (comma-separated)", _roles),
    Flag(flags.RUN_DIR, "", "the run directory the ranks and the agent use (empty: the hook's default rule)"),
    Flag("slots.trusted-uids", frozenset(), "uids that may own the run dir besides this user and root", _uids),
    Flag("agent.listen-address", "0.0.0.0:19400", "the agent's --web.listen-address", flags.listen_address),
    Flag(
        "coordinator.listen-address", "127.0.0.1:19401", "the coordinator's --web.listen-address", flags.listen_address
    ),
    Flag("coordinator.url", "", "the agent's --coordinator.url (empty: not checked)"),
    Flag("coordinator.ca-file", "", "CA certificate(s) to verify an https coordinator"),
    jobtoken.file_flag("the job token file the daemons use"),
    jobtoken.inline_flag("the job token (prefer the file)"),
    Flag("stacks.py-spy", "", "the agent's --stacks.py-spy (empty: beside this interpreter, else PATH)"),
    JOURNAL_FLAG,
    Flag("path.procfs", "/proc", "procfs mount point (node_exporter's flag)"),
    Flag("timeout-seconds", 5.0, "timeout of each probe", flags.positive_float),
)


def host_from(values: dict) -> Host:
    return Host(
        roles=values["role"],
        run_dir=values[flags.dest_of(flags.RUN_DIR)],
        trusted_uids=values["slots_trusted_uids"],
        agent_listen=values["agent_listen_address"],
        coordinator_listen=values["coordinator_listen_address"],
        coordinator_url=values["coordinator_url"].rstrip("/"),
        ca_file=values["coordinator_ca_file"],
        token=_token(values),
        token_file=values[flags.dest_of(jobtoken.FILE)],
        py_spy=values["stacks_py_spy"],
        proc_root=values["path_procfs"],
        journal=values[JOURNAL_FLAG.dest],
        timeout_s=values["timeout_seconds"],
    )


def _token(values: dict) -> str:
    """A token file the doctor cannot read is its own finding (token_file), not a crash."""
    try:
        return jobtoken.read(values)
    except flags.FlagError:
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = f"--{JSON}" in args
    args = [a for a in args if a != f"--{JSON}"]
    try:
        values = flags.parse(
            "watchdog doctor",
            DESCRIPTION + " Switches: " + ", ".join(f"--{name} ({what})" for name, what in SWITCHES) + ".",
            FLAGS,
            args,
        )
        host = host_from(values)
    except (flags.FlagError, ValueError) as exc:
        print(f"watchdog doctor: {exc}", file=sys.stderr)
        return 2
    results = run(host)
    if as_json:
        print(json.dumps({"roles": sorted(host.roles), "checks": [r.to_dict() for r in results]}, indent=1))
    else:
        for r in results:
            print(f"{MARK.get(r.status, r.status)} {r.name:<16} {r.detail}")
            if r.fix:
                print(f"     {'':<16} fix: {r.fix}")
    return exit_code(results)
