"""Failure fingerprints and the restart-loop breaker: pure, no processes, no sleeps."""

from __future__ import annotations

import pytest

from watchdog.contracts.finding import Finding
from watchdog.coordinator import testing as T
from watchdog.coordinator.control import fingerprint as fpm
from watchdog.coordinator.control.loop import JobController
from watchdog.coordinator.control.policy import JobControl, plan
from watchdog.coordinator.control.repeats import escalate
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.policy_file import Policy, PolicyError, Repeats, parse_policy
from watchdog.coordinator.view.cluster import empty


def hang(ranks=(2,), hosts=("h1",), step=12, seq=40, op="all_reduce", group=0, detected=95.0):
    culprits = {str(r): {"host": (hosts or ("?",))[0], "step": step, "coll_seq": seq - 1} for r in ranks}
    return Finding(
        kind="collective_hang",
        ranks=ranks,
        hosts=hosts,
        reason="rank 2 never entered all_reduce #40",
        onset_mono=detected - 10,
        detected_mono=detected,
        evidence={"group": group, "seq": seq, "op": op, "culprits": culprits},
        wants_stacks=ranks,
    )


def dead(ranks=(1,), hosts=("h1",), detected=95.0):
    return Finding(
        kind="dead_rank",
        ranks=ranks,
        hosts=hosts,
        reason="rank 1 died",
        onset_mono=detected - 1,
        detected_mono=detected,
    )


def slow(ranks=(1,), hosts=("h1",), detected=95.0):
    return Finding(
        kind="straggler",
        ranks=ranks,
        hosts=hosts,
        reason=f"rank {ranks[0]} computes 2.3x slower than the median",
        onset_mono=detected - 5,
        detected_mono=detected,
    )


FRAMES = ("wait (train.py:80)", "loop (train.py:120)", "main (train.py:200)")


def test_fingerprint_of_a_hang_reads_its_evidence():
    fp = fpm.of(hang(), FRAMES)
    assert (fp.kind, fp.hosts, fp.ranks, fp.group, fp.seq, fp.op, fp.step) == (
        "collective_hang",
        ("h1",),
        (2,),
        0,
        40,
        "all_reduce",
        12,
    )
    assert fp.frames == FRAMES
    assert fpm.of(dead()).step is None and fpm.of(dead()).op == ""


def test_culprit_frames_from_a_stack_groups_record():
    rec = {
        "groups": [
            {"culprit": False, "frames": [["x", "a.py", 1]]},
            {
                "culprit": True,
                "frames": [
                    ["wait", "train.py", 80],
                    ["loop", "train.py", 120],
                    ["main", "train.py", 200],
                    ["<module>", "train.py", 300],
                ],
            },
        ]
    }
    assert fpm.culprit_frames(rec) == FRAMES
    assert fpm.culprit_frames({"groups": [{"culprit": True, "frames": []}]}) == ()
    assert fpm.culprit_frames({"groups": [{"culprit": True, "frames": "junk"}]}) == ()


MATCH = [
    # name, a, b, same place, same host
    ("identical", fpm.of(hang()), fpm.of(hang()), True, True),
    ("seq differs (restarted from another checkpoint)", fpm.of(hang(seq=40)), fpm.of(hang(seq=7)), True, True),
    ("other host, same place", fpm.of(hang()), fpm.of(hang(hosts=("h2",))), True, False),
    ("other step", fpm.of(hang(step=12)), fpm.of(hang(step=13)), False, True),
    ("other op", fpm.of(hang(op="all_reduce")), fpm.of(hang(op="broadcast")), False, True),
    ("frames only on one side: not compared", fpm.of(hang(), FRAMES), fpm.of(hang()), True, True),
    ("frames differ", fpm.of(hang(), FRAMES), fpm.of(hang(), ("other (x.py:1)",)), False, True),
    ("other kind", fpm.of(hang()), fpm.of(dead()), False, False),
    ("the same straggler", fpm.of(slow()), fpm.of(slow(hosts=("h2",))), True, False),
    ("a straggler has no place but its rank", fpm.of(slow(ranks=(1,))), fpm.of(slow(ranks=(0,))), False, True),
    ("no culprit host never matches by host", fpm.of(hang(hosts=())), fpm.of(hang(hosts=())), True, False),
]


@pytest.mark.parametrize("name,a,b,place,host", MATCH, ids=[m[0] for m in MATCH])
def test_matching(name, a, b, place, host):
    assert (fpm.same_place(a, b), fpm.same_host(a, b)) == (place, host)


def test_escalation_rules():
    rules = Repeats()
    first = fpm.of(hang(hosts=("h1",)), FRAMES)
    assert escalate(first, (), rules) is None
    other_host = escalate(fpm.of(hang(hosts=("h2",)), FRAMES), (first,), rules)
    assert other_host is not None and (other_host.action, other_host.rule) == ("abort", "same_place")
    assert other_host.reason.startswith("deterministic: the same failure at the same place after 1 restart(s)")
    same = escalate(fpm.of(hang(hosts=("h1",))), (first,), rules)
    assert same is not None and (same.action, same.rule) == ("exclude_host_restart", "same_host")
    # A one-host job: excluding the host is no remedy, the place decides.
    off = escalate(fpm.of(hang()), (first,), Repeats(same_host="off"))
    assert off is not None and (off.action, off.rule) == ("abort", "same_place")
    one_host = escalate(fpm.of(hang()), (first,), rules, hosts_in_job=1)
    assert one_host is not None and (one_host.action, one_host.rule) == ("abort", "same_place")
    # Culprits on every host of the job (a job-wide event) are as one host: the place decides.
    everywhere = fpm.of(hang(hosts=("h1", "h2")))
    every = escalate(everywhere, (fpm.of(hang(hosts=("h1", "h2")), FRAMES),), rules, hosts_in_job=2)
    assert every is not None and (every.action, every.rule) == ("abort", "same_place")
    same_host = escalate(everywhere, (fpm.of(hang(hosts=("h1", "h2")), FRAMES),), rules, hosts_in_job=3)
    assert same_host is not None and same_host.rule == "same_host"
    # ... and a repeat elsewhere in the code on that one host is no repeat: restart, within the budget.
    assert escalate(fpm.of(hang(step=50)), (first,), rules, hosts_in_job=1) is None
    # Another place on another host: a new failure, not a repeat.
    assert escalate(fpm.of(hang(hosts=("h2",), step=50)), (first,), rules) is None
    # after = 2: the third occurrence escalates.
    assert escalate(fpm.of(hang(hosts=("h3",))), (first,), Repeats(after=2)) is None
    assert escalate(fpm.of(hang(hosts=("h3",))), (first, fpm.of(hang(hosts=("h2",)))), Repeats(after=2)) is not None
    assert escalate(fpm.of(hang(hosts=("h2",))), (first,), Repeats(same_place="off", same_host="off")) is None


def test_a_straggler_after_a_straggler_restart_is_a_repeat_only_on_the_same_rank():
    """On one host, rank 0 slow after the restart that cured rank 1 is a new failure
    (the restart budget decides), not 'the same failure at the same place'."""
    first = fpm.of(slow(ranks=(1,)))
    assert escalate(fpm.of(slow(ranks=(0,))), (first,), Repeats(), hosts_in_job=1) is None
    again = escalate(fpm.of(slow(ranks=(1,))), (first,), Repeats(), hosts_in_job=1)
    assert again is not None and (again.action, again.rule) == ("abort", "same_place")
    assert "restart(s): straggler on rank 1 (hosts h1)" in again.reason, again.reason


POL = Policy(
    actions={"collective_hang": "restart", "dead_rank": "restart"},
    min_finding_age_s=0,
    cooldown_s=0,
    max_restarts=10,
    max_restarts_per_hour=10,
)


def test_plan_escalates_a_repeat_instead_of_restarting_again():
    job = JobControl().remember(fpm.of(hang(hosts=("h1",))))
    p = plan([hang(hosts=("h2",))], job, 200.0, POL)
    assert p.action == "abort" and p.escalation is not None
    assert "deterministic: the same failure at the same place after 1 restart(s)" in p.reason
    assert (
        plan([dead(hosts=("h1",))], JobControl().remember(fpm.of(dead(hosts=("h1",)))), 200.0, POL).action
        == "exclude_host_restart"
    )
    # An alert-only kind is never escalated (destructive actions stay opt-in).
    assert plan([hang()], job, 200.0, Policy(min_finding_age_s=0)).action == "alert"


def test_controller_remembers_completes_and_journals_the_escalation():
    c = JobController(POL)
    view = empty("j", 4)
    _, events = T.with_lines(c.tick([hang(hosts=("h1",))], view, 200.0))
    started = next(p for n, p in events if n == je.ACTION)
    assert started["action"] == "restart" and started["fingerprint"]["step"] == 12
    assert c.job.history[0].frames == ()
    c.stacks({"kind": "collective_hang", "ranks": [2]}, FRAMES)  # the stacks arrive after the action started
    assert c.job.history[0].frames == FRAMES
    c.op = None  # the restart is over (its own module's business)
    c.job = JobControl(restarts=c.job.restarts, history=c.job.history)
    _, events = T.with_lines(c.tick([hang(hosts=("h2",), detected=300.0)], view, 400.0))
    names = [n for n, _ in events]
    assert je.REPEAT_FAILURE in names and names.index(je.REPEAT_FAILURE) < names.index(je.ACTION)
    rep = dict(events)[je.REPEAT_FAILURE]
    assert rep["rule"] == "same_place" and rep["occurrences"] == 2 and rep["action"] == "abort"
    assert rep["earlier"][0]["frames"] == list(FRAMES)


def test_policy_file_repeats_section():
    pol = parse_policy('[repeats]\nsame_host = "off"\nsame_place = "abort"\nafter = 2\n')
    assert pol.repeats == Repeats(same_host="off", same_place="abort", after=2)
    assert parse_policy("").repeats == Repeats()
    for bad, msg in (
        ('[repeats]\nsame_host = "restart"', "same_host"),
        ("[repeats]\nafter = 0", "after"),
        ("[repeats]\nnope = 1", "unknown key"),
    ):
        with pytest.raises(PolicyError, match=msg):
            parse_policy(bad)


def test_the_timeline_tells_the_escalation_with_its_action():
    from watchdog.contracts.journal import parse
    from watchdog.timeline import action_story as tl

    rec = parse(
        {
            "event": je.REPEAT_FAILURE,
            "t_wall": 10.0,
            "action_id": "a-2",
            "rule": "same_place",
            "occurrences": 2,
            "action": "abort",
            "reason": "deterministic: the same failure at the same place after 1 restart(s): x",
        }
    )
    assert tl.is_action(rec)
    ((_, indent, text),) = tl.lines([rec])
    assert indent == 1 and text.startswith("repeat (same_place, occurrence 2): escalated to abort: deterministic")


def test_the_restarted_group_failing_again_is_a_new_finding_not_the_restarts_effect():
    from dataclasses import replace as _replace

    from watchdog.coordinator import testing as T

    c = JobController(POL)
    v = T.view([T.rank(r, world_size=4) for r in range(4)], 100.0)
    c.tick([hang(hosts=("host0",), detected=100.0)], v, 101.0)
    assert c.op is not None
    assert [r for r, _ in c.op.workers] == [0, 1, 2, 3]
    # The old rank 2, found dead within the window: the restart's own effect.
    dead_old = _replace(dead(ranks=(2,), hosts=("host0",)), detected_mono=102.0)
    assert c.caused_by(dead_old, 102.0, v) == c.op.id
    # A new incarnation of rank 2 (torchrun restarted it) hanging again: a repeat, not an effect.
    new = T.view([T.rank(2, world_size=4, pid=9002, proc_start_us=1_800_000_000_000_000)], 110.0, base=v, seq=2)
    assert c.caused_by(_replace(hang(hosts=("host0",)), detected_mono=110.0), 110.0, new) == ""
