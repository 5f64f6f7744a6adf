"""A silent host's ranks judged on their peers' evidence (analysis/silence.py), never presumed dead.

Host1 (ranks 4-7) last reported at 94.0 and is silent past its limit (5 x 1 s) at
100.5; host0 (ranks 0-3) reports on. Time is a number.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import health, silence
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.dead_rank import DeadRank
from watchdog.coordinator.detectors.host_unobserved import HostUnobserved
from watchdog.coordinator.view.cluster import LauncherExit

CFG = DetectorConfig()
NOW = 100.5
PEERS, SILENT = range(4), range(4, 8)


def at(r, seq, **kw):
    """Between collectives, #seq done (the step number is the collective's)."""
    return t.rank(r, step=seq, **kw)


def waits(r, seq, since, **kw):
    """Inside collective #seq for ``since`` s, no step since."""
    return t.rank(
        r, step=seq - 1, step_age_s=since + 0.5, collective=t.coll(seq=seq, outstanding=1, since_s=since), **kw
    )


def failed_in(r, seq, **kw):
    return waits(r, seq, 1.0, alive=False, proc_status="gone", gone_age_s=0.1, **kw)


# (name, peers' states (host0, at NOW), silent host's last states (host1, at 94.0), verdict, evidence)
CASES = [
    (
        "peers completed collectives past the silent ranks' last: provably alive",
        [at(r, 160) for r in PEERS],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "peers_progress",
    ),
    (
        "peers neither ahead nor waiting: nothing either way",
        [at(r, 100) for r in PEERS],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "none",
    ),
    (
        "peers wait without progress in a collective the silent ranks were not seen entering",
        [waits(r, 101, since=6.5) for r in PEERS],
        [at(r, 100) for r in SILENT],
        silence.LOST,
        "peers_waiting",
    ),
    (
        "peers wait in a collective the silent ranks were seen entering: not theirs to answer",
        [waits(r, 101, since=6.5) for r in PEERS],
        [waits(r, 101, since=0.1) for r in SILENT],
        silence.UNOBSERVED,
        "none",
    ),
    (
        "peers wait for one in a checkpoint: the hang detector's allowance first",
        [t.rank(0, step=100, step_age_s=7.0, phase="checkpoint")] + [waits(r, 101, since=6.5) for r in range(1, 4)],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "none",
    ),
    (
        "peers wait, but not yet for the silence limit",
        [waits(r, 101, since=2.0) for r in PEERS],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "none",
    ),
    (
        "a peer failed inside a collective since the silence began: lost",
        [failed_in(0, 101)] + [waits(r, 101, since=1.0) for r in range(1, 4)],
        [at(r, 100) for r in SILENT],
        silence.LOST,
        "peer_failed",
    ),
    (
        "a peer failed outside any collective first: a root cause of its own, no evidence",
        [at(0, 100, alive=False, proc_status="gone", gone_age_s=0.1)] + [waits(r, 101, since=1.0) for r in range(1, 4)],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "none",
    ),
    (
        "every peer exited: nobody to vouch, cannot see",
        [at(r, 100, status="exited", alive=False) for r in PEERS],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "no_peers",
    ),
    (
        "a one-host job: nobody to vouch, cannot see",
        [],
        [at(r, 100) for r in SILENT],
        silence.UNOBSERVED,
        "no_peers",
    ),
]


def _view(peers, silent):
    return t.view([*peers, *silent], now=NOW, received={"host1": 94.0})


@pytest.mark.parametrize("name,peers,silent,verdict,evidence", CASES, ids=[c[0] for c in CASES])
def test_a_silent_host_is_judged_on_its_peers(name, peers, silent, verdict, evidence):
    view = _view(peers, silent)
    (s,) = health.silences(view, NOW, CFG).values()
    assert (s.host, s.ranks, s.verdict, s.evidence["evidence"]) == ("host1", (4, 5, 6, 7), verdict, evidence), s.why
    dead = [f for f in DeadRank(CFG).check(NOW, view) if f.hosts == ("host1",)]
    unseen = HostUnobserved(CFG).check(NOW, view)
    if verdict == silence.LOST:
        assert [f.ranks for f in dead] == [(4, 5, 6, 7)] and unseen == []
        assert s.why in dead[0].reason
    else:  # never a finding against its ranks: one about the monitor, naming the host and no rank
        assert dead == [] and [(f.kind, f.ranks, f.hosts) for f in unseen] == [("host_unobserved", (), ("host1",))]
        assert s.why in unseen[0].reason and health.classify_all(view, NOW, CFG)[4] == health.OK


def test_proof_of_life_is_dated_by_the_peers_last_progress():
    view = _view([at(r, 160, step_age_s=0.3) for r in PEERS], [at(r, 100) for r in SILENT])
    (s,) = health.silences(view, NOW, CFG).values()
    assert s.alive_until == pytest.approx(NOW - 0.3) and "provably alive" in s.why


def test_a_death_seen_before_the_silence_is_a_death():
    """The agent's last report said rank 4 was gone: dead on that report, not for the silence."""
    silent = [at(4, 100, alive=False, proc_status="gone", gone_age_s=0.1)] + [at(r, 100) for r in range(5, 8)]
    view = _view([at(r, 160) for r in PEERS], silent)
    assert [f.ranks for f in DeadRank(CFG).check(NOW, view)] == [(4,)]
    (s,) = health.silences(view, NOW, CFG).values()
    assert s.ranks == (5, 6, 7) and s.verdict == silence.UNOBSERVED


def test_a_peer_restarted_by_its_launcher_since_the_silence_is_evidence():
    """torchrun replaced host0's ranks after host1 went silent: the group broke."""
    first = _view([at(r, 100) for r in PEERS], [at(r, 100) for r in SILENT])
    gone = t.view(
        [at(r, 101, alive=False, proc_status="gone", gone_age_s=0.0) for r in PEERS], now=97.0, base=first, seq=2
    )
    back = t.view(
        [t.rank(r, pid=7000 + r, proc_start_us=1_800_000_000_000_000, step=0) for r in PEERS], now=NOW, base=gone, seq=3
    )
    (s,) = health.silences(back, NOW, CFG).values()
    assert s.verdict == silence.LOST and "restarted by its launcher" in s.why


def test_quiet_before_the_limit_is_not_judged():
    view = _view([at(r, 160) for r in PEERS], [at(r, 100) for r in SILENT])
    assert health.silences(view, 98.9, CFG) == {} and HostUnobserved(CFG).check(98.9, view) == []


def _exited(peers, status, when=97.0):
    """host1's launcher told the coordinator it exited with ``status`` at ``when``."""
    v = _view(peers, [t.rank(r, step=100) for r in SILENT])
    return t.as_folded(replace(v, launcher_exits={"host1": LauncherExit(pid=4242, status=status, at=when)}))


# (name, peers, launcher status, verdict, in the reason)
EXITS = [
    ("a one-host job whose launcher failed: its ranks are gone", [], 1, silence.LOST, "exited with status 1"),
    ("killed by a signal", [], -9, silence.LOST, "was killed by SIGKILL"),
    ("peers vouched for them, then their launcher failed", [at(r, 160) for r in PEERS], 3, silence.LOST, "status 3"),
]


@pytest.mark.parametrize("name,peers,status,verdict,why", EXITS, ids=[c[0] for c in EXITS])
def test_the_launchers_exit_is_evidence_while_its_agent_is_silent(name, peers, status, verdict, why):
    view = _exited(peers, status)
    (s,) = health.silences(view, NOW, CFG).values()
    assert (s.verdict, s.evidence["evidence"], s.evidence["launcher_status"]) == (verdict, "launcher_exit", status)
    assert why in s.why and "pid 4242" in s.why
    (dead,) = [f for f in DeadRank(CFG).check(NOW, view) if f.hosts == ("host1",)]
    assert dead.ranks == (4, 5, 6, 7) and s.why in dead.reason and dead.evidence["launcher_status"] == status
    assert HostUnobserved(CFG).check(NOW, view) == []


def test_a_launcher_that_exited_0_is_a_finished_job_not_a_silent_host():
    view = _exited([], 0)
    (s,) = health.silences(view, NOW, CFG).values()
    assert s.verdict == silence.FINISHED and "the job finished there" in s.why
    assert DeadRank(CFG).check(NOW, view) == [] and HostUnobserved(CFG).check(NOW, view) == []
    assert set(health.classify_all(view, NOW, CFG).values()) == {health.EXITED}
    assert {health.classify(rv, view, NOW, CFG) for rv in view.ranks.values()} == {health.EXITED}


def test_an_exit_from_before_the_ranks_started_says_nothing_about_them():
    """Another launcher's (the host's ranks registered at 94.0, after it): cannot see, as before."""
    (s,) = health.silences(_exited([], 1, when=90.0), NOW, CFG).values()
    assert (s.verdict, s.evidence["evidence"]) == (silence.UNOBSERVED, "no_peers")
