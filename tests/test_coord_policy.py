"""The policy and the job state machine: pure, no processes, no sleeps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.contracts.finding import Finding
from watchdog.coordinator.control.policy import IDLE, TRANSITIONS, JobControl, plan, transition
from watchdog.coordinator.policy_file import Policy, PolicyError, parse_policy
from watchdog.coordinator.vocabularies import JobState

S = JobState


def finding(kind="dead_rank", ranks=(1,), onset=90.0, detected=95.0):
    return Finding(
        kind=kind, ranks=ranks, hosts=("h",), reason=f"{kind} on {ranks}", onset_mono=onset, detected_mono=detected
    )


RESTART_ALL = Policy(
    actions=dict.fromkeys(("dead_rank", "frozen_rank", "collective_hang"), "restart"),
    min_finding_age_s=2.0,
    cooldown_s=60.0,
    max_restarts=3,
    max_restarts_per_hour=2,
)


def test_default_policy_only_alerts():
    p = plan([finding(), finding("collective_hang", (2,))], JobControl(), now=200.0, policy=Policy())
    assert p.action == "alert" and not p.held


CASES = [
    # name, findings, job, now, want action, want held
    ("acts once the finding is old enough", [finding(detected=95.0)], JobControl(), 97.5, "restart", False),
    ("too young: held", [finding(detected=95.0)], JobControl(), 96.0, "alert", True),
    ("action in flight: held", [finding()], JobControl(state=S.RESTARTING), 200.0, "alert", True),
    ("failed job: nothing more", [finding()], JobControl(state=S.FAILED), 200.0, "alert", True),
    ("cooldown after the last action", [finding()], JobControl(last_action_at=150.0), 200.0, "alert", True),
    ("cooldown over", [finding()], JobControl(last_action_at=100.0), 200.0, "restart", False),
    (
        "budget: 3 restarts used -> abort",
        [finding()],
        JobControl(restarts=(0.0, 4000.0, 8000.0)),
        9000.0,
        "abort",
        False,
    ),
    ("budget: 2 in the last hour -> abort", [finding()], JobControl(restarts=(8000.0, 8500.0)), 9000.0, "abort", False),
    ("one old restart is fine", [finding()], JobControl(restarts=(100.0,)), 9000.0, "restart", False),
    ("alert-only kinds are ignored", [finding("straggler", (3,))], JobControl(), 200.0, "alert", False),
]


@pytest.mark.parametrize("name,findings,job,now,want,held", CASES, ids=[c[0] for c in CASES])
def test_plan_table(name, findings, job, now, want, held):
    p = plan(findings, job, now, RESTART_ALL)
    assert (p.action, p.held) == (want, held), p.reason


def test_budget_reason_says_why():
    p = plan([finding()], JobControl(restarts=(0.0, 4000.0, 8000.0)), 9000.0, RESTART_ALL)
    assert p.reason.startswith("restart budget exhausted (3 of 3 restarts used); aborting instead. dead_rank:")


def test_most_drastic_action_wins_then_root_cause_first():
    pol = Policy(
        actions={"straggler": "checkpoint_restart", "dead_rank": "restart", "collective_hang": "abort"},
        min_finding_age_s=0,
    )
    later_dead, earlier_dead = finding(ranks=(2,), onset=50.0), finding(ranks=(1,), onset=40.0)
    p = plan([finding("straggler", (3,)), later_dead, earlier_dead], JobControl(), 200.0, pol)
    assert p.action == "restart" and p.finding is not None
    assert p.finding.ranks == (1,)  # the earliest death is the root cause
    p = plan([later_dead, finding("collective_hang", (2,))], JobControl(), 200.0, pol)
    assert p.action == "abort"


def test_dry_run_plans_but_marks_it():
    pol = Policy(actions={"dead_rank": "restart"}, dry_run=True, min_finding_age_s=0)
    p = plan([finding()], JobControl(), 200.0, pol)
    assert p.action == "restart" and p.dry_run


def test_transitions():
    assert transition(S.RUNNING, "checkpoint_restart") is S.CHECKPOINTING
    assert transition(S.CHECKPOINTING, "checkpoint_timeout") is S.RESTARTING
    assert transition(S.RESTARTING, "resumed") is S.RUNNING
    assert transition(S.ABORTING, "aborted") is S.FAILED
    with pytest.raises(PolicyError, match="failed does not allow 'restart'"):
        transition(S.FAILED, "restart")
    # FAILED is terminal and every non-idle state can still be aborted.
    assert not [k for k in TRANSITIONS if k[0] is S.FAILED]
    for state in set(S) - IDLE - {S.FAILED, S.ABORTING}:
        assert transition(state, "abort") is S.ABORTING


def test_parse_policy_file():
    pol = parse_policy("""
[actions]
dead_rank = "restart"
collective_hang = "abort"
[limits]
dry_run = true
max_restarts = 5
cooldown_seconds = 30
""")
    assert pol.action_for("dead_rank") == "restart" and pol.action_for("straggler") == "alert"
    assert pol.dry_run and pol.max_restarts == 5 and pol.cooldown_s == 30.0


@pytest.mark.parametrize(
    "text,msg",
    [
        ("[actions]\nded_rank = 'restart'", "unknown finding kind 'ded_rank'"),
        ("[actions]\ndead_rank = 'reboot'", "dead_rank = 'reboot'; actions are"),
        ("[limits]\nmax_restarts = -1", "must be a number >= 0"),
        ("[limits]\ndry_run = 'yes'", "must be a boolean"),
        ("[limits]\ncooldown = 3", "unknown key 'cooldown'"),
        ("[action]\n", "unknown section"),
        ("[actions\n", "not valid TOML"),
    ],
)
def test_parse_policy_errors_are_clear(text, msg):
    with pytest.raises(PolicyError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(text)


def test_exclude_host_restart_never_excludes_every_host_of_the_job():
    """Ranks of every host frozen together (a suspend) name every host: no host is
    the cause, and stopping each one's launcher would end the job."""
    pol = Policy(actions={"frozen_rank": "exclude_host_restart"}, min_finding_age_s=0)
    whole = Finding(
        kind="frozen_rank",
        ranks=(0, 1),
        hosts=("h0", "h1"),
        reason="froze together",
        onset_mono=90.0,
        detected_mono=95.0,
    )
    p = plan([whole], JobControl(), 200.0, pol, hosts_in_job=2)
    assert p.action == "restart" and p.reason.startswith(
        "frozen_rank names every host of the job (2): no host to exclude"
    )
    # One host of the two, or the job's hosts unknown: that host is excluded.
    assert (
        plan([replace(whole, hosts=("h1",))], JobControl(), 200.0, pol, hosts_in_job=2).action == "exclude_host_restart"
    )
    assert plan([whole], JobControl(), 200.0, pol).action == "exclude_host_restart"
