"""``watchdog demo``: a real multi-rank CPU job, monitored end to end, on this machine.

Starts a coordinator, an agent and ``torchrun --nproc_per_node=N
examples/train_ddp.py`` (gloo), optionally with an injected fault, prints the
coordinator's findings as they are journaled, and ends with a summary. Everything
runs on 127.0.0.1 with a fresh token; nothing is left running afterwards.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from watchdog.contracts.finding import ACTIONABLE_KINDS
from watchdog.contracts.journal import Record, parse
from watchdog.contracts.journal.actions import (
    ActionOutcomeRecord,
    ActionProgressRecord,
    ActionRecord,
    CheckpointedRecord,
    CheckpointFailedRecord,
    LauncherRestartRecord,
    RestartRecord,
    ResumedRecord,
)
from watchdog.contracts.journal.findings import FindingRecord, ResolvedRecord
from watchdog.contracts.journal.ranks import StateRecord
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.policy_file import load_policy
from watchdog.coordinator.vocabularies import ACTIONS
from watchdog.dev import localjob

# The demo's own --json lines; findings, resolutions and actions keep their journal names.
INFO = "info"
SUMMARY = "summary"
# Past the linger, how long to wait for the first finding's evidence to come back.
EVIDENCE_WAIT_S = 20.0
# The line of the example script's docstring that opens its table of fault forms.
FAULT_TABLE = "``--fault SPEC`` injects faults"


def fault_forms(script: Path = localjob.EXAMPLE_SCRIPT) -> tuple[str, ...]:
    """The ``--fault`` forms the example script accepts, as its docstring's table lists
    them (``kill:R@S``, ...): read from the file, so the demo's help never imports torch."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    lines = doc.split(FAULT_TABLE, 1)[1].splitlines()[1:] if FAULT_TABLE in doc else []
    forms: list[str] = []
    for line in lines:
        if line.strip() and not line.startswith(" "):
            break  # the table ends at the next paragraph
        if line.startswith("    ") and not line.startswith("     "):
            forms.append(line.split()[0])
    return tuple(forms)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="watchdog demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, default=4, help="worker processes (default 4)")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        help=f"fault to inject (repeatable), one of {', '.join(fault_forms())} "
        "(R: a rank, S: a step, F: a slowdown factor, N: elements; see examples/train_ddp.py), e.g. hang:2@30",
    )
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--compute-ms", type=float, default=50.0, help="simulated compute per step (default 50)")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    p.add_argument("--work-dir", default=None, help="keep logs, slots and the journal here (default: a temp dir)")
    p.add_argument(
        "--linger-seconds",
        type=float,
        default=8.0,
        help="after the first finding, keep watching this long (and until its evidence is in, "
        f"at most {EVIDENCE_WAIT_S:g} s more) before stopping the job",
    )
    p.add_argument("--timeout-seconds", type=float, default=180.0, help="stop everything after this long")
    p.add_argument(
        "--action",
        choices=[a for a in ACTIONS if a != "alert"],
        default=None,
        help="act on every finding with this action (a generated policy: no cooldown wait, findings "
        "acted on after 1 s); the job runs under torchrun --max-restarts with checkpoints",
    )
    p.add_argument(
        "--policy",
        default=None,
        help="coordinator policy file (TOML, as the coordinator's --policy.file takes); wins over --action",
    )
    p.add_argument("--max-restarts", type=int, default=3, help="torchrun --max-restarts when acting (default 3)")
    p.add_argument("--script", default=str(localjob.EXAMPLE_SCRIPT), help="training script (default: the example)")
    p.add_argument("script_args", nargs="*", help="extra arguments for the training script (after --)")
    return p


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error("--ranks must be >= 1")
    if args.policy:
        load_policy(args.policy)  # a bad file fails here, with the coordinator's message
    if not Path(args.script).exists():
        p.error(f"training script {args.script} not found (run from a checkout, or pass --script)")
    return args


class Printer:
    def __init__(self, as_json: bool, t0_wall: float) -> None:
        self.as_json, self.t0_wall = as_json, t0_wall

    def info(self, text: str, **fields: Any) -> None:
        if self.as_json:
            print(json.dumps({"event": INFO, "message": text, **fields}), flush=True)
        else:
            print(f"demo: {text}", flush=True)

    def finding(self, rec: FindingRecord) -> None:
        t = round(_wall(rec) - self.t0_wall, 2)
        if self.as_json:
            out: dict[str, Any] = {"event": je.FINDING, "kind": rec.kind, "ranks": rec.ranks, "t": t}
            out.update(reason=rec.reason, evidence=rec.evidence)
            if rec.onset_wall:  # 0: not known
                out["onset_t"] = round(rec.onset_wall - self.t0_wall, 3)
            print(json.dumps(out), flush=True)
        else:
            print(f"[t+{t:6.2f}s] FINDING {rec.kind}: {rec.reason}", flush=True)

    def action(self, rec: Record) -> None:
        """action / action_outcome / restart / resumed / job state lines."""
        t = round(_wall(rec) - self.t0_wall, 2)
        ev = rec.event
        d = rec.to_dict()
        keep = (
            "action_id",
            "action",
            "kind",
            "ranks",
            "reason",
            "ok",
            "result",
            "restart",
            "step",
            "steps_lost",
            "seconds",
            "job_state",
            "from",
            "on",
            "phase",
            "signal",
            "workers",
            "launchers",
            "gone",
            "waiting_s",
            "dry_run",
            "error",
        )
        if self.as_json:
            print(json.dumps({"event": ev, "t": t, **{k: d[k] for k in keep if k in d}}), flush=True)
            return
        if isinstance(rec, ActionRecord):
            text = f"ACTION {rec.action} ({rec.action_id}{', dry run' if rec.dry_run else ''}): {rec.reason}"
        elif isinstance(rec, ActionProgressRecord):
            text = (
                f"  checkpoint at step {rec.step} requested from ranks {rec.workers}"
                if rec.phase == "checkpoint"
                else f"  waiting up to {rec.waiting_s} s for the launcher to stop workers {rec.workers or []}"
                if rec.phase == "launcher"
                else f"  {rec.signal} -> launchers {rec.launchers or []}, workers {rec.workers or []}"
                if rec.workers or rec.launchers
                else "  no worker left to stop (torchrun tore the group down)"
            )
        elif isinstance(rec, ActionOutcomeRecord):
            text = f"OUTCOME {rec.action} {'ok' if rec.ok else 'FAILED'}: {rec.result}"
        elif isinstance(rec, CheckpointedRecord):
            text = f"CHECKPOINTED at step {rec.step} on ranks {rec.ranks}"
        elif isinstance(rec, CheckpointFailedRecord):
            text = f"CHECKPOINT FAILED (step {rec.step}): {rec.error}; restarting from the last checkpoint"
        elif isinstance(rec, RestartRecord):
            text = f"RESTART {rec.restart}: workers {rec.stopped} stopped, torchrun restarts the group"
        elif isinstance(rec, LauncherRestartRecord):
            text = (
                f"RESTART {rec.restart} by the launcher: workers {rec.gone} already gone, torchrun restarts the group"
            )
        elif isinstance(rec, ResumedRecord):
            lost = f", {rec.steps_lost} steps lost" if rec.steps_lost is not None else ""
            text = (
                f"RESUMED restart {rec.restart}, resumed from step {rec.step}{lost} ({rec.seconds} s after the action)"
            )
        elif isinstance(rec, StateRecord):
            text = f"job state {rec.from_state} -> {rec.job_state} ({rec.on})"
        else:
            text = f"{ev}: {d}"
        print(f"[t+{t:6.2f}s] {text}", flush=True)

    def resolved(self, rec: ResolvedRecord) -> None:
        t = round(_wall(rec) - self.t0_wall, 2)
        if self.as_json:
            print(json.dumps({"event": je.RESOLVED, "kind": rec.kind, "ranks": rec.ranks, "t": t}), flush=True)
        else:
            print(f"[t+{t:6.2f}s] resolved {rec.kind} ranks {rec.ranks}", flush=True)


def _wall(rec: Record) -> float:
    return rec.t_wall if rec.t_wall is not None else time.time()


class JournalTail:
    """Reads complete new lines from the journal as the coordinator appends them."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.buf = path, 0, b""

    def poll(self) -> list[Record]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(parse(_flat(obj)))
        return out


class EvidenceWait:
    """Whether the evidence asked for the first finding (slot snapshots, stacks,
    Flight Recorder buffers: one command per host and type) has come back, so the
    demo stops the job only once the post-mortem it points at is complete. A
    slow machine can take longer than the linger to answer (py-spy pauses each
    rank in turn); a command that expires or is refused counts as answered."""

    OUTCOMES = (je.EVIDENCE, je.COMMAND_DONE, je.COMMAND_REFUSED, je.COMMAND_EXPIRED)

    def __init__(self) -> None:
        self.trigger: dict | None = None
        self.pending: set[tuple[str, str]] = set()  # (type, host)
        self.asked = False

    def see(self, rec: Record) -> None:
        if type(rec) is FindingRecord and self.trigger is None:
            self.trigger = {"kind": rec.kind, "ranks": rec.ranks}
        elif self.trigger is None or getattr(rec, "trigger", None) != self.trigger:
            return
        elif rec.event == je.COMMAND or rec.event in self.OUTCOMES:
            asked = (str(getattr(rec, "type", None)), str(getattr(rec, "host", None)))
            if rec.event == je.COMMAND:
                self.pending.add(asked)
                self.asked = True
            else:
                self.pending.discard(asked)

    @property
    def complete(self) -> bool:
        return self.asked and not self.pending


def _flat(obj: dict) -> dict:
    """Journal records may nest the finding; flatten what the printer needs."""
    inner = obj.get("finding")
    if not isinstance(inner, dict):
        return obj
    return {**inner, **{k: v for k, v in obj.items() if k != "finding"}}


# Printed as action lines: an action's steps, checkpoint_restart's save, and the
# job's state changes (je.STATE records with a job_state; a rank's are not shown).
# The timeline's group differs: it lists the policy holding back, not the save.
ACTION_EVENTS = (*je.ACTION_STEPS, *je.CHECKPOINT_STEPS, je.STATE)


def _told(rec: Record) -> bool:
    """An action's line, or the job's state change (not a rank's)."""
    return rec.event in ACTION_EVENTS and (not isinstance(rec, StateRecord) or rec.has("job_state"))


def _write_policy(path: Path, action: str) -> Path:
    """Every finding kind -> ``action``; act after 1 s, cooldown 10 s, 3 s grace."""
    lines = [
        "[actions]",
        *(f'{k} = "{action}"' for k in ACTIONABLE_KINDS),
        "",
        "[limits]",
        "min_finding_age_seconds = 1",
        "cooldown_seconds = 10",
        "abort_grace_seconds = 3",
        "max_restarts = 3",
        "max_restarts_per_hour = 3",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    job = f"demo-{secrets.token_hex(3)}"
    # A fresh directory per run: a journal or slot left by an earlier run in the
    # same --work-dir must never be read as this run's.
    base = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="watchdog-demo-"))
    work = base / job if args.work_dir else base
    work.mkdir(parents=True, exist_ok=True)
    run_dir, journal = work / "run", work / "journal.jsonl"
    run_dir.mkdir(exist_ok=True)
    token_file = work / "token"
    token_file.write_text(secrets.token_hex(16))
    os.chmod(token_file, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token_file)}
    t0_wall = time.time()
    out = Printer(args.json, t0_wall)

    coordinator = agent = None
    policy_file = args.policy or (_write_policy(work / "policy.toml", args.action) if args.action else None)
    acting = policy_file is not None
    torchrun = _torchrun_job(args, job, work, run_dir, acting)
    actions: list[Record] = []
    findings: list[FindingRecord] = []
    exit_code = None
    try:
        coordinator = localjob.start_coordinator(
            work,
            job,
            args.ranks,
            journal,
            extra=["--tick.interval-seconds", "0.25", *(["--policy.file", str(policy_file)] if acting else [])],
            env=env,
        )
        agent = localjob.start_agent(
            work,
            run_dir,
            job,
            env=env,
            extra=["--coordinator.url", coordinator.url, "--report.interval-seconds", "0.25"],
        )
        out.info(f"coordinator {coordinator.url}, agent {agent.url}, work dir {work}")
        t0_wall = out.t0_wall = time.time()
        torchrun.start()
        out.info(
            f"torchrun --nproc_per_node={args.ranks} {Path(args.script).name} "
            f"--steps {args.steps} {' '.join('--fault=' + f for f in args.fault)}".rstrip()
        )
        tail = JournalTail(journal)
        first_finding_at = None
        evidence = EvidenceWait()
        deadline = time.monotonic() + args.timeout_seconds
        while time.monotonic() < deadline:
            for rec in tail.poll():
                evidence.see(rec)
                if type(rec) is FindingRecord:
                    findings.append(rec)
                    out.finding(rec)
                    first_finding_at = first_finding_at or time.monotonic()
                elif isinstance(rec, ResolvedRecord):
                    out.resolved(rec)
                elif _told(rec):
                    actions.append(rec)
                    out.action(rec)
            exit_code = torchrun.proc.popen.poll() if torchrun.proc else None
            if exit_code is not None:
                time.sleep(1.0)  # let the last report and tick land in the journal
                for rec in tail.poll():
                    if type(rec) is FindingRecord:
                        findings.append(rec)
                        out.finding(rec)
                    elif _told(rec):
                        actions.append(rec)
                        out.action(rec)
                break
            # With a policy the job's end is the story (restarted, or aborted): no linger cut-off.
            # Past the linger, the job stops once the first finding's evidence is in.
            since = time.monotonic() - first_finding_at if first_finding_at else 0.0
            waited = evidence.complete or since > args.linger_seconds + EVIDENCE_WAIT_S
            if not acting and first_finding_at and since > args.linger_seconds and waited:
                out.info("stopping the job (detection only: no action policy in this demo run)")
                break
            time.sleep(0.1)
        else:
            out.info(f"timeout after {args.timeout_seconds} s")
    finally:
        # Coordinator first: the job's teardown must not be journaled as ranks dying.
        for proc in (coordinator, agent):
            if proc is not None:
                proc.stop()
        torchrun.stop()

    summary = {
        "event": SUMMARY,
        "ranks": args.ranks,
        "faults": args.fault,
        "job": job,
        "job_exit_code": exit_code,
        "findings": [{"kind": f.kind, "ranks": f.ranks} for f in findings],
        "actions": [
            {
                k: d[k]
                for k in ("event", "action_id", "action", "ok", "result", "restart", "step", "job_state", "reason")
                if k in d
            }
            for d in (a.to_dict() for a in actions)
        ],
        "journal": str(journal),
        "work_dir": str(work),
        "t0_wall": round(t0_wall, 6),  # job start; finding "t" values count from here
        "elapsed_s": round(time.time() - t0_wall, 2),
        "timeline": f"watchdog timeline {journal}",  # the post-mortem, for whoever reads this next
    }
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        _print_summary(summary)
    return 0


def _torchrun_job(args: argparse.Namespace, job: str, work: Path, run_dir: Path, acting: bool) -> localjob.TorchrunJob:
    """The demo's torchrun job; with an action policy, torchrun may restart it and
    the script checkpoints so a restart resumes."""
    script_args = list(args.script_args)
    torchrun_args: list[str] = []
    if acting:
        torchrun_args = [f"--max-restarts={args.max_restarts}"]
        if "--ckpt-dir" not in script_args:  # a restart resumes from the latest checkpoint
            # checkpoint_restart saves on request: periodic saves after S would move the resume point.
            every = "0" if args.action == "checkpoint_restart" else "10"
            script_args += ["--ckpt-dir", str(work / "ckpt"), "--ckpt-every", every]
    return localjob.TorchrunJob(
        nproc=args.ranks,
        run_dir=run_dir,
        job=job,
        work_dir=work,
        script=Path(args.script),
        script_args=[
            "--steps",
            str(args.steps),
            "--compute-ms",
            str(args.compute_ms),
            *[f"--fault={f}" for f in args.fault],
            *script_args,
        ],
        torchrun_args=torchrun_args,
    )


def _print_summary(summary: dict) -> None:
    """The summary for a reader (``--json`` prints the dict itself)."""
    kinds = ", ".join(f"{f['kind']} {f['ranks']}" for f in summary["findings"]) or "none"
    print(f"\nsummary: {len(summary['findings'])} finding(s): {kinds}")
    for a in summary["actions"]:
        if a["event"] in (je.ACTION, je.ACTION_OUTCOME, je.RESUMED):
            text = (
                f"restart {a.get('restart')}, resumed from step {a.get('step')}"
                if a["event"] == je.RESUMED
                else f"{a.get('action', '')} {a.get('result') or a.get('reason') or ''}"
            )
            print(f"{a['event']}: {text}".rstrip())
    exit_code = summary["job_exit_code"]
    print(f"job exit code: {exit_code if exit_code is not None else 'stopped by the demo'}")
    print(f"journal: {summary['journal']}")
    print(f"logs:    {summary['work_dir']}")
    print(f"post-mortem: {summary['timeline']}   (--html timeline.html for the swim lanes)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
