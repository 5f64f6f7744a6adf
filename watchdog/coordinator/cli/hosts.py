"""``watchdog hosts``: the hosts that keep failing, over every job, from Prometheus.

    watchdog hosts --prometheus http://prometheus:9090 [--min-score 1] [--json]

Every coordinator exports ``watchdog_coordinator_host_culprit_findings_total``
(per culprit host and cause); the shipped recording rules (rank-watchdog.hosts in
deploy/prometheus/rules/watchdog-recording.rules.yml) turn them into a decaying
suspicion score per host over all jobs. This prints the suspects, with the
causes and jobs behind each score, and the lines that keep the next job off
them: Slurm's ``--exclude=`` and ``scontrol update ... State=DRAIN`` (the node out
of every job's way, with the evidence as its reason), ``kubectl taint`` /
``kubectl cordon``. They are printed, never run: taking a node out of service is
the operator's decision. Host names and causes come from Prometheus labels: what
goes into a printed command is shell-quoted.

Without the recording rules loaded, the same expressions are evaluated inline.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ... import flags, promquery
from ...promquery import Endpoint, PromError, query
from ..metrics import HOST_CULPRITS

FLAGS = (
    flags.Flag("prometheus", "http://127.0.0.1:9090", "Prometheus base URL (a bare HOST:PORT works too)"),
    flags.Flag("min-score", 1.0, "print hosts whose suspicion score is at least this", float),
    flags.Flag("timeout-seconds", 10.0, "HTTP timeout", flags.positive_float),
    *promquery.FLAGS,
)
DESCRIPTION = (
    "Print the hosts rank-watchdog coordinators keep blaming, over all jobs, with their evidence and "
    "the Slurm --exclude= / scontrol drain / kubectl taint lines to avoid them (printed, never run)."
)
# Switches (no value), beside the flags: (name, what it does).
SWITCHES = (("json", "print the suspects as JSON"),)

TAINT = "rank-watchdog/suspect=true:NoSchedule"
_COUNTER = f"{HOST_CULPRITS}_total"
# name of the recorded series -> the same expression inline (the rules in rank-watchdog.hosts)
SCORE = (
    "host:watchdog_suspicion:score",
    f"(sum by (host) (increase({_COUNTER}[1d])) or 0 * sum by (host) (increase({_COUNTER}[7d])))"
    f" + 0.25 * sum by (host) (increase({_COUNTER}[7d]))",
)
EVIDENCE = f"sum by (host, cause, training_job) (increase({_COUNTER}[7d])) > 0"


def suspects(base: str | Endpoint, min_score: float, timeout: float) -> list[dict[str, Any]]:
    """[{host, score, causes: {cause: n}, jobs: [..]}], highest score first."""
    recorded, inline = SCORE
    scores = query(base, recorded, timeout) or query(base, inline, timeout)
    evidence = query(base, EVIDENCE, timeout)
    out: dict[str, dict[str, Any]] = {}
    for s in scores:
        host = s["metric"].get("host", "")
        if host and s["value"] >= min_score:
            out[host] = {"host": host, "score": round(s["value"], 3), "causes": {}, "jobs": []}
    for s in evidence:
        m = s["metric"]
        h = out.get(m.get("host", ""))
        if h is None:
            continue
        cause = m.get("cause", "?")
        h["causes"][cause] = round(h["causes"].get(cause, 0.0) + s["value"], 2)
        job = m.get("training_job", "")
        if job and job not in h["jobs"]:
            h["jobs"].append(job)
    for h in out.values():
        h["jobs"].sort()
    return sorted(out.values(), key=lambda h: (-h["score"], h["host"]))


def drain(host: dict[str, Any]) -> str:
    """The scontrol line that drains ``host``, its evidence as the reason Slurm shows."""
    causes = ", ".join(f"{c} x{n:g}" for c, n in sorted(host["causes"].items(), key=lambda kv: -kv[1]))
    reason = f"rank-watchdog: suspicion {host['score']:g}" + (f", culprit in 7 days: {causes}" if causes else "")
    return f"scontrol update NodeName={shlex.quote(host['host'])} State=DRAIN Reason={shlex.quote(reason)}"


def render(hosts: list[dict[str, Any]], base: str, min_score: float) -> str:
    if not hosts:
        return f"no suspect hosts (suspicion score >= {min_score:g}) in {base}"
    lines = [f"suspect hosts (suspicion score >= {min_score:g}, over every job in {base}):", ""]
    width = max(len(h["host"]) for h in hosts)
    for h in hosts:
        causes = ", ".join(f"{c} x{n:g}" for c, n in sorted(h["causes"].items(), key=lambda kv: -kv[1]))
        jobs = f"; jobs {', '.join(h['jobs'][:8])}" + (" ..." if len(h["jobs"]) > 8 else "") if h["jobs"] else ""
        lines.append(
            f"  {h['host']:<{width}}  score {h['score']:<6g} culprit in the last 7 days: {causes or '-'}{jobs}"
        )
    names = [h["host"] for h in hosts]
    lines += [
        "",
        "to keep the next job off them (printed, not run):",
        f"  slurm:      sbatch --exclude={','.join(names)} ...",
        "              (or, for every job: " + "; ".join(drain(h) for h in hosts) + ")",
        "  kubernetes: " + "\n              ".join(f"kubectl taint nodes {n} {TAINT}" for n in names),
        "              (or: " + "; ".join(f"kubectl cordon {n}" for n in names) + ")",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    switches = argparse.ArgumentParser(add_help=False)
    for name, _ in SWITCHES:
        switches.add_argument(f"--{name}", action="store_true")
    known, rest = switches.parse_known_args(argv)
    try:
        described = DESCRIPTION + " Switches: " + ", ".join(f"--{name} ({what})" for name, what in SWITCHES) + "."
        values = flags.parse("watchdog hosts", described, FLAGS, rest)
    except flags.FlagError as exc:
        print(f"watchdog hosts: {exc}", file=sys.stderr)
        return 2
    min_score = values["min_score"]
    try:
        base = promquery.endpoint(values["prometheus"], values)
        hosts = suspects(base, min_score, values["timeout_seconds"])
    except PromError as exc:
        print(f"watchdog hosts: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(hosts, indent=2) if known.json else render(hosts, base.url, min_score), file=out)
    return 0
