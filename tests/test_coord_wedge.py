"""Wedged together (analysis/wedge.py, detectors/wedged.py): every rank stopped at once, nobody
missing; one verdict naming the hosts and the group, never a rank, and never counted
against a rank or a host. Time is a number."""

from __future__ import annotations

import pytest

from watchdog.coordinator import policy_file
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config, DetectorConfig
from watchdog.coordinator.control import policy
from watchdog.coordinator.detectors.collective_hang import CollectiveHang
from watchdog.coordinator.detectors.frozen_rank import FrozenRank
from watchdog.coordinator.detectors.wedged import Wedged
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator

CFG = DetectorConfig()
HISTORY = t.steps(1, 50, step_s=0.1)  # 0.1 s steps: the hang deadline is the floor (5 s)


def frozen(r, age, **kw):
    """SIGSTOPped, its heartbeat ``age`` s old; inside all-reduce #812 or between collectives."""
    kw.setdefault("recent_steps", HISTORY)
    return t.rank(r, heartbeat_age_s=age, proc_status="stopped", cpu_percent=0.0, step=811, step_age_s=age, **kw)


def waiting(r, since=12.4, seq=812, **kw):
    kw.setdefault("recent_steps", HISTORY)
    return t.rank(r, step=811, step_age_s=since + 0.05, collective=t.coll(seq=seq, outstanding=1, since_s=since), **kw)


def stuck(r, age=12.9):
    return t.rank(r, step=811, step_age_s=age, recent_steps=HISTORY, collective=t.coll(seq=811, done_seq=811))


IN = t.coll(seq=812, outstanding=1, since_s=4.0)
# (name, states, wedge evidence "how" or None, the other detectors' (kind, ranks))
CASES = [
    (
        "every rank frozen within 100 ms, some in the all-reduce: one wedge",
        [frozen(r, 4.0 + 0.1 * (r % 2), collective=IN if r % 3 else None) for r in range(8)],
        "frozen_together",
        [],
    ),
    (
        "every rank waiting in one collective past the deadline, none missing: one wedge",
        [waiting(r) for r in range(8)],
        "one_collective",
        [],
    ),
    (
        "frozen 2 s apart: not one instant, frozen_rank names them apart",
        [frozen(r, 4.0 if r < 4 else 6.0) for r in range(8)],
        None,
        [("frozen_rank", (0, 1, 2, 3)), ("frozen_rank", (4, 5, 6, 7))],
    ),
    (
        "one rank still beating: it is missing, the frozen are named",
        [frozen(r, 4.0) if r < 7 else t.rank(7, recent_steps=HISTORY) for r in range(8)],
        None,
        [("frozen_rank", (0, 1, 2, 3, 4, 5, 6))],
    ),
    (
        "all waiting but one that never entered: the hang names it, no wedge",
        [stuck(r) if r == 3 else waiting(r) for r in range(8)],
        None,
        [("collective_hang", (3,))],
    ),
    (
        "rank 0 stopped by a signal before the all-reduce, rank 1 frozen running inside it waiting for rank 0"
        " (DDP's wait keeps the GIL): no wedge, rank 0 alone is named",
        [
            frozen(0, 4.0),
            t.rank(
                1,
                heartbeat_age_s=3.7,
                proc_status="sleeping",
                cpu_percent=0.0,
                step=811,
                step_age_s=3.7,
                recent_steps=HISTORY,
                collective=t.coll(seq=812, outstanding=1, since_s=3.8),
            ),
        ],
        None,
        [("frozen_rank", (0,))],
    ),
    (
        "all waiting, under the hang deadline: nothing yet",
        [waiting(r, since=3.0) for r in range(8)],
        None,
        [],
    ),
]


@pytest.mark.parametrize("name,states,how,others", CASES, ids=[c[0] for c in CASES])
def test_wedge_table(name, states, how, others):
    view = t.view(states, now=100.0)
    wedges = Wedged(CFG).check(100.0, view)
    found = sorted((f.kind, f.ranks) for d in (FrozenRank(CFG), CollectiveHang(CFG)) for f in d.check(100.0, view))
    assert found == others
    if how is None:
        assert wedges == []
        return
    (w,) = wedges
    assert (w.kind, w.ranks, w.hosts, w.evidence["how"]) == ("wedged", (), ("host0", "host1"), how)
    assert "no rank is blamed" in w.reason and "ranks 0-7" in w.reason


def test_the_collective_wedge_names_the_group():
    (w,) = Wedged(CFG).check(100.0, t.view([waiting(r, seq=812) for r in range(8)], now=100.0))
    assert "all_reduce #812 on the default group" in w.reason
    assert (w.evidence["group"], w.evidence["seq"], w.evidence["ranks_total"]) == (0, 812, 8)


def test_a_policy_may_restart_on_a_wedge_and_it_is_nobodys_repeat():
    p = policy_file.parse_policy(
        '[actions]\nwedged = "restart"\n[limits]\nmin_finding_age_seconds = 0\ncooldown_seconds = 0'
    )
    (w,) = Wedged(CFG).check(100.0, t.view([waiting(r) for r in range(8)], now=100.0))
    job = policy.JobControl()
    for _ in range(2):  # the same wedge again after a restart: still a restart, no escalation
        plan = policy.plan([w], job, 100.0, p, hosts_in_job=2)
        assert (plan.action, plan.fingerprint, plan.escalation) == ("restart", None, None)
        job = job.restarted(50.0)
    # exclude_host_restart on a wedge names every host: a plain restart instead
    p = policy_file.parse_policy('[actions]\nwedged = "exclude_host_restart"\n[limits]\nmin_finding_age_seconds = 0')
    assert policy.plan([w], policy.JobControl(), 100.0, p, hosts_in_job=2).action == "restart"


def test_host_unobserved_can_only_alert():
    with pytest.raises(policy_file.PolicyError, match="advisory"):
        policy_file.parse_policy('[actions]\nhost_unobserved = "restart"')


def test_a_wedge_counts_against_no_host(tmp_path):
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=8), Journal(path, lambda: (1.7e9, 0.0)))
    for host, ranks in (("host0", range(4)), ("host1", range(4, 8))):
        c.accept(t.report(host, [waiting(r) for r in ranks]), 100.0)
    assert [f.key for f in c.tick(100.1, 1.7e9).opened] == [("wedged", ())]
    reg = c.registry
    for host in ("host0", "host1"):
        sample = reg.get_sample_value(
            "watchdog_coordinator_host_culprit_findings_total", {"training_job": "job", "host": host, "cause": "wedged"}
        )
        assert sample == 0.0
    c.journal.close()


def test_a_wedge_that_ends_host_by_host_names_no_rank_on_the_host_heard_last():
    """Every rank resumes at once, but host1's agent reports it before host0's: for a
    report interval host0's ranks still look frozen beside ranks that run. They froze
    with those (FoldedRank.resumed): the wedge ending, not ranks frozen on their own."""
    run = t.view([t.rank(r, recent_steps=HISTORY) for r in range(8)], now=95.0)
    stopped = t.view([frozen(r, 4.0) for r in range(8)], now=100.0, base=run, seq=2)  # last beats at 96.0
    (w,) = Wedged(CFG).check(100.0, stopped)
    assert w.evidence["how"] == "frozen_together"
    back = [t.rank(r, recent_steps=HISTORY, heartbeat_age_s=0.1) for r in range(4, 8)]
    half = t.view(back, now=101.0, base=stopped, seq=3, received={"host1": 101.0})
    assert half.ranks[5].resumed == pytest.approx((96.0, 100.9))
    assert FrozenRank(CFG).check(101.2, half) == [] and CollectiveHang(CFG).check(101.2, half) == []
    assert [f.kind for f in Wedged(CFG).check(101.2, half)] == ["wedged"]
    # A rank that kept running through it (its agent never read it stale) is someone missing:
    # not a wedge, and the frozen ones are named.
    running = [t.rank(r, recent_steps=HISTORY) if r == 5 else frozen(r, 4.0) for r in range(8)]
    others = t.view(running, now=100.0, base=run, seq=2)
    others = t.view([t.rank(r, recent_steps=HISTORY) for r in range(4, 8)], now=101.0, base=others, seq=3)
    assert others.ranks[5].resumed is None and others.ranks[4].resumed is not None
    assert Wedged(CFG).check(101.2, others) == []
    assert [f.ranks for f in FrozenRank(CFG).check(101.2, others)] == [(0, 1, 2, 3)]


def test_a_peer_that_only_beat_late_while_it_waits_has_not_resumed_from_a_stop():
    """test_e2e_periodic in a fresh-clone run: rank 1 waits in DDP's all-reduce, its heartbeat
    late by more than a stopped rank's threshold but less than a running rank's, then beating
    again; rank 0 is SIGSTOPped alone outside the collective in the same instant. Rank 1 was
    never stopped, so it did not resume from a stop it shared with rank 0: no wedge, and
    frozen_rank names rank 0 with rank 1 its victim."""
    run = t.view([t.rank(r, recent_steps=HISTORY) for r in range(2)], now=95.0)
    late = t.rank(
        1,
        heartbeat_age_s=1.2,  # last beat at 98.8: past 1 s (stopped), under 3 s (running)
        proc_status="sleeping",
        step=811,
        step_age_s=1.3,
        recent_steps=HISTORY,
        collective=t.coll(seq=812, outstanding=1, since_s=1.1),
    )
    first = t.view([t.rank(0, recent_steps=HISTORY), late], now=100.0, base=run, seq=2)
    beating = t.rank(
        1,
        heartbeat_age_s=0.1,
        proc_status="sleeping",
        step=811,
        step_age_s=1.8,
        recent_steps=HISTORY,
        collective=t.coll(seq=812, outstanding=1, since_s=1.6),
    )
    view = t.view([frozen(0, 1.6), beating], now=100.5, base=first, seq=3)  # rank 0's last beat at 98.9
    assert view.ranks[1].resumed is None
    assert Wedged(CFG).check(100.6, view) == []
    (f,) = FrozenRank(CFG).check(100.6, view)
    assert f.ranks == (0,) and "stopped by a signal" in f.reason, f.reason


def test_ranks_that_freeze_together_while_starting_up_are_neither_wedged_nor_frozen_until_the_warmup_allowance():
    """test_e2e_corpus in a fresh-clone run at load 6: a healthy trl job's two ranks, before
    either stepped, stopped beating within 39 ms of each other for 3.9 s while their imports
    held the GIL. Start-up gets the warm-up allowance that collective_hang gives it; a freeze
    that outlasts it is one, and a stopped rank is named at once, started or not."""
    from watchdog.coordinator.analysis.health import FROZEN, OK, classify, classify_all

    def starting(r, age, **kw):
        return t.rank(r, step=0, step_age_s=age, heartbeat_age_s=age, phase="other", pg_state="none", **kw)

    base = t.view([starting(r, 0.1) for r in range(2)], now=96.0, ranks_per_host=2)
    imports = t.view([starting(0, 3.9), starting(1, 3.861)], now=100.0, base=base, seq=2, ranks_per_host=2)
    assert list(classify_all(imports, 100.0, CFG).values()) == [OK, OK]
    assert [classify(imports.ranks[r], imports, 100.0, CFG) for r in range(2)] == [OK, OK]
    assert [d.check(100.0, imports) for d in (Wedged(CFG), FrozenRank(CFG), CollectiveHang(CFG))] == [[], [], []]

    allowance = CFG.frozen_heartbeat_s + CFG.hang_warmup_allowance_s
    late = t.view(
        [starting(0, allowance + 1), starting(1, allowance + 0.96)],
        now=100.0 + allowance,
        base=imports,
        seq=3,
        ranks_per_host=2,
    )
    assert list(classify_all(late, 100.0 + allowance, CFG).values()) == [FROZEN, FROZEN]
    (w,) = Wedged(CFG).check(100.0 + allowance, late)
    assert w.evidence["how"] == "frozen_together"

    stopped = t.view(
        [starting(0, 1.5, proc_status="stopped", cpu_percent=0.0), starting(1, 0.1)],
        now=100.0,
        base=base,
        seq=2,
        ranks_per_host=2,
    )
    (f,) = FrozenRank(CFG).check(100.0, stopped)
    assert f.ranks == (0,) and "stopped by a signal" in f.reason, f.reason
