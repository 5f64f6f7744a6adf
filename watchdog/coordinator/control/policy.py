"""Policy: which action a finding earns, as a pure function of (findings, job, now).

The policy file (``policy_file.py``) says which kinds earn which action; alert
is the default for every kind, destructive actions are opt-in.

The job's own state machine (``JobState`` + ``TRANSITIONS``) says what may
happen next; ``plan`` never starts an action while another is in flight, and a
restart that the budget no longer allows becomes an abort, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ...contracts.finding import BLAMELESS_KINDS, Finding
from ..policy_file import Policy, PolicyError
from ..vocabularies import JobState
from . import fingerprint
from .repeats import Escalation, escalate, every_host

# Most drastic first: when several findings want different actions, the most
# drastic wins (a hang that needs an abort is not fixed by a checkpoint).
SEVERITY = {"abort": 4, "restart": 3, "exclude_host_restart": 2, "checkpoint_restart": 1, "alert": 0}
SEVERITY["rollback_restart"] = 3  # a restart that also names the checkpoint (loss_anomaly)
RESTARTING_ACTIONS = frozenset({"restart", "checkpoint_restart", "exclude_host_restart", "rollback_restart"})


S = JobState
# (state, event) -> next state. Anything not listed is refused (and logged).
TRANSITIONS: dict[tuple[JobState, str], JobState] = {
    (S.RUNNING, "findings_open"): S.DEGRADED,
    (S.DEGRADED, "findings_clear"): S.RUNNING,
    (S.RUNNING, "restart"): S.RESTARTING,
    (S.DEGRADED, "restart"): S.RESTARTING,
    (S.RUNNING, "exclude_host_restart"): S.RESTARTING,
    (S.DEGRADED, "exclude_host_restart"): S.RESTARTING,
    (S.RUNNING, "rollback_restart"): S.RESTARTING,
    (S.DEGRADED, "rollback_restart"): S.RESTARTING,
    (S.RUNNING, "checkpoint_restart"): S.CHECKPOINTING,
    (S.DEGRADED, "checkpoint_restart"): S.CHECKPOINTING,
    (S.CHECKPOINTING, "checkpoint_done"): S.RESTARTING,
    (S.CHECKPOINTING, "checkpoint_timeout"): S.RESTARTING,  # fall back to the last checkpoint
    (S.RESTARTING, "resumed"): S.RUNNING,
    (S.RESTARTING, "restart_failed"): S.FAILED,
    (S.RUNNING, "abort"): S.ABORTING,
    (S.DEGRADED, "abort"): S.ABORTING,
    (S.CHECKPOINTING, "abort"): S.ABORTING,
    (S.RESTARTING, "abort"): S.ABORTING,
    (S.ABORTING, "aborted"): S.FAILED,
}
IDLE = frozenset({S.RUNNING, S.DEGRADED})  # no action in flight


def transition(state: JobState, event: str) -> JobState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise PolicyError(f"job state {state.value} does not allow {event!r}") from None


@dataclass(frozen=True)
class JobControl:
    """What the policy needs to know about the job's past actions."""

    state: JobState = S.RUNNING
    # Coordinator monotonic times of every restart of the job: its own (started) and its
    # launcher's (seen: control/budget.py). One budget for both.
    restarts: tuple[float, ...] = ()
    by_launcher: int = 0  # how many of ``restarts`` the launcher made by itself
    last_action_at: float | None = None
    # Fingerprints of the findings restarts were spent on, oldest first (control/repeats.py).
    history: tuple[fingerprint.Fingerprint, ...] = ()

    def restarted(self, now: float) -> JobControl:
        return replace(self, restarts=self.restarts + (now,), last_action_at=now)

    def launcher_restarted(self, at: float) -> JobControl:
        """The launcher restarted the group by itself (control/budget.py): it spends the budget, no cooldown."""
        return replace(self, restarts=tuple(sorted(self.restarts + (at,))), by_launcher=self.by_launcher + 1)

    def remember(self, fp: fingerprint.Fingerprint) -> JobControl:
        return replace(self, history=(self.history + (fp,))[-64:])

    def complete(self, kind: str, ranks: tuple[int, ...], frames: tuple[str, ...]) -> JobControl:
        """Stacks arrived for a finding: fill the frames of its fingerprints that lack them."""
        hist = tuple(
            fp.with_frames(frames) if (fp.kind, fp.ranks) == (kind, ranks) and not fp.frames else fp
            for fp in self.history
        )
        return replace(self, history=hist) if hist != self.history else self


@dataclass(frozen=True)
class Plan:
    action: str  # one of ACTIONS; "alert" means do nothing destructive
    finding: Finding | None
    reason: str
    dry_run: bool = False
    held: bool = False  # a destructive action was wanted but held back (cooldown, age, in flight)
    fingerprint: fingerprint.Fingerprint | None = None  # of the finding acted on (restarting actions)
    escalation: Escalation | None = None  # set when the restart-loop breaker changed the action


def plan(
    findings: Iterable[Finding],
    job: JobControl,
    now: float,
    policy: Policy,
    frames: Mapping[tuple[str, tuple[int, ...]], tuple[str, ...]] | None = None,
    hosts_in_job: int = 0,
) -> Plan:
    """The one action to take now, if any. Pure.

    ``findings`` are the active ones as first raised (``detected_mono`` is when).
    Root cause first: among findings wanting the same action, the earliest onset
    is the one acted on and named.
    """
    wanted = [f for f in findings if policy.action_for(f.kind) != "alert"]
    if not wanted:
        return Plan("alert", None, "no finding asks for an action")
    wanted.sort(key=lambda f: (-SEVERITY[policy.action_for(f.kind)], f.onset_mono, f.kind, f.ranks))
    f = wanted[0]
    action = policy.action_for(f.kind)
    if job.state not in IDLE:
        return Plan("alert", f, f"{action} for {f.kind} held: job is {job.state.value}", held=True)
    age = now - f.detected_mono
    if age < policy.min_finding_age_s:
        return Plan(
            "alert",
            f,
            f"{action} for {f.kind} held: finding is {age:.1f} s old, policy waits {policy.min_finding_age_s:g} s",
            held=True,
        )
    if job.last_action_at is not None and now - job.last_action_at < policy.cooldown_s:
        left = policy.cooldown_s - (now - job.last_action_at)
        return Plan("alert", f, f"{action} for {f.kind} held: cooldown, {left:.0f} s left", held=True)
    reason = f"{f.kind}: {f.reason}"
    fp, esc = None, None
    if action in RESTARTING_ACTIONS and f.kind not in BLAMELESS_KINDS:  # a wedge is nobody's repeat
        action, reason, fp, esc = _repeat(f, action, reason, job, policy, frames or {}, hosts_in_job)
    if action == "exclude_host_restart" and every_host(f.hosts, hosts_in_job):
        # A job-wide event (every rank frozen together, a hang naming all): no host is the
        # cause, and stopping every host's launcher would end the job.
        action, reason = (
            "restart",
            f"{f.kind} names every host of the job ({hosts_in_job}): no host to exclude; restarting instead. {reason}",
        )
    if action in RESTARTING_ACTIONS:
        in_hour = sum(1 for t in job.restarts if now - t < 3600.0)
        if len(job.restarts) >= policy.max_restarts:
            action, reason = (
                "abort",
                (
                    f"restart budget exhausted ({len(job.restarts)} of {policy.max_restarts} "
                    f"restarts used{_launcher_part(job)}); aborting instead. {reason}"
                ),
            )
        elif in_hour >= policy.max_restarts_per_hour:
            action, reason = (
                "abort",
                (
                    f"restart budget exhausted ({in_hour} restarts in the last hour, "
                    f"limit {policy.max_restarts_per_hour}{_launcher_part(job)}); aborting instead. {reason}"
                ),
            )
    return Plan(action, f, reason, dry_run=policy.dry_run, fingerprint=fp, escalation=esc)


def _launcher_part(job: JobControl) -> str:
    return f"; {job.by_launcher} restart(s) so far by the launcher itself" if job.by_launcher else ""


def _repeat(
    f: Finding,
    action: str,
    reason: str,
    job: JobControl,
    policy: Policy,
    frames: Mapping[tuple[str, tuple[int, ...]], tuple[str, ...]],
    hosts_in_job: int,
) -> tuple[str, str, fingerprint.Fingerprint, Escalation | None]:
    """The restart-loop breaker (control/repeats.py): a failure seen before a restart
    already escalates instead of spending the budget again."""
    fp = fingerprint.of(f, frames.get(f.key, ()))
    esc = escalate(fp, job.history, policy.repeats, hosts_in_job)
    if esc is None:
        return action, reason, fp, None
    return esc.action, f"{esc.reason}; escalating to {esc.action}. {reason}", fp, esc


def after_failed_restart(finding: Finding, result: str, policy: Policy) -> Plan:
    """A restart that did not bring the job back is an outcome, and it escalates:
    abort, whose first step takes every rank's stack (the evidence of why the
    new group is stuck), instead of leaving the job stuck with a never_joined
    finding and no decision. No budget or cooldown applies: the abort ends the
    restart in flight, it does not start another."""
    return Plan("abort", finding, f"{result}; escalating to abort (every rank's stack first)", dry_run=policy.dry_run)
