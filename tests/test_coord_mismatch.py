"""collective_mismatch: ranks at the same (group, seq) with another op, size or
dtype; the odd rank is named from the shapes, never whoever died first."""

from __future__ import annotations

import json
from typing import TypedDict

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis.health import analyze
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors import build
from watchdog.coordinator.detectors.collective_hang import CollectiveHang
from watchdog.coordinator.detectors.collective_mismatch import CollectiveMismatch
from watchdog.coordinator.detectors.dead_rank import DeadRank
from watchdog.coordinator.view.cluster import COLL_HISTORY
from watchdog.report import CollSig, HostReport, ReportError

CFG = DetectorConfig()
WORLD = 3


def history(odd: dict[int, dict] | None = None, n: int = 4, world: int = WORLD):
    """Collectives 1..n on every rank; ``odd`` = {rank: changes to its collective n}."""
    out = []
    for r in range(world):
        sigs = [t.sig(s, age_s=float(n - s) + 1.0) for s in range(1, n)]
        sigs.append(t.sig(n, age_s=1.0, **(odd or {}).get(r, {})))
        out.append(tuple(sigs))
    return out


def job(colls, per_rank: dict[int, dict] | None = None):
    per_rank = per_rank or {}
    return [t.rank(r, world_size=len(colls), recent_colls=c, **per_rank.get(r, {})) for r, c in enumerate(colls)]


def check(states, now=101.0):
    return CollectiveMismatch(CFG).check(now, t.view(states, now=100.0))


CASES = [
    ("another size", {1: {"elements": 6}}, (1,), "all_reduce of 6 float32 [6]"),
    ("another dtype", {2: {"dtype": "bfloat16"}}, (2,), "all_reduce of 4 bfloat16 [4]"),
    ("another op", {0: {"op": "broadcast"}}, (0,), "broadcast of 4 float32 [4]"),
]


@pytest.mark.parametrize("name,odd,culprits,shape", CASES, ids=[c[0] for c in CASES])
def test_the_minority_is_named_with_both_shapes(name, odd, culprits, shape):
    (f,) = check(job(history(odd)))
    assert f.ranks == culprits and f.evidence["seq"] == 4 and f.evidence["source"] == "fr"
    assert shape in f.reason and "all_reduce of 4 float32 [4]" in f.reason
    assert f.onset_mono == pytest.approx(99.0)  # when the collective was issued, not when anyone died


def test_agreeing_ranks_and_uneven_all_to_all_are_no_mismatch():
    assert check(job(history())) == []
    uneven = {r: {"op": "all_to_all", "elements": 4 + r} for r in range(WORLD)}
    assert check(job(history(uneven))) == []


def test_two_ranks_that_disagree_accuse_no_one():
    (f,) = check(job(history({1: {"elements": 6}}, world=2)))
    assert f.ranks == () and "no majority" in f.reason
    assert "all_reduce of 6 float32" in f.reason and "all_reduce of 4 float32" in f.reason


def test_the_earliest_mismatch_is_the_one_reported():
    colls = history({1: {"elements": 6}}, n=5)
    colls[2] = (*colls[2][:3], t.sig(4, elements=9, age_s=2.0), colls[2][4])  # rank 2 odd at #4, earlier
    (f,) = check(job(colls))
    assert f.ranks == (2,) and f.evidence["seq"] == 4


def test_an_old_incarnations_numbering_is_not_compared():
    colls = history({1: {"elements": 6}})
    colls[1] = tuple(t.sig(c.seq, elements=c.elements, age_s=c.age_s + 3600.0) for c in colls[1])
    assert check(job(colls)) == []


def test_hook_marks_name_the_odd_rank_when_the_flight_recorder_saw_nothing():
    """A crash within milliseconds: FR not read yet, but the patched all_reduce
    wrote op and bytes into the slot before calling gloo."""
    states = [
        t.rank(
            r, world_size=WORLD, collective=t.coll(seq=4, outstanding=1 if r == 1 else 0, nbytes=24 if r == 1 else 16)
        )
        for r in range(WORLD)
    ]
    (f,) = check(states)
    assert f.ranks == (1,) and f.evidence["source"] == "hook" and "24 bytes" in f.reason


def test_first_death_was_a_healthy_rank_the_odd_one_is_still_the_root_cause():
    """gloo: rank 0 read rank 1's odd message and died first; rank 1 died later."""
    v = t.view(job(history()), now=99.5)
    states = job(
        history({1: {"elements": 6}}),
        {0: {"alive": False, "proc_status": "gone", "gone_age_s": 0.5}, 1: {"alive": False, "gone_age_s": 0.2}},
    )
    v = t.view(states, now=100.0, base=v, seq=2)
    findings = [f for d in build(CFG) for f in d.check(101.0, v)]
    root = min(findings, key=lambda f: f.onset_mono)
    assert (root.kind, root.ranks) == ("collective_mismatch", (1,))
    assert {r for f in findings for r in f.ranks} == {1}  # rank 0 died first and is named nowhere
    assert [f.ranks for f in DeadRank(CFG).check(101.0, v)] == [(1,)]


def test_a_hang_after_a_mismatch_blames_the_odd_rank_not_the_ranks_behind():
    """The usual ranks got stuck in #4 while the odd one went on to #5."""
    wait = {
        r: {"collective": t.coll(seq=5 if r == 1 else 4, outstanding=1, since_s=30.0), "step_age_s": 31.0}
        for r in range(WORLD)
    }
    v = t.view(job(history({1: {"elements": 6}}), wait), now=100.0)
    blame = analyze(v, 100.0, CFG)
    assert blame is not None and (blame.how, blame.culprits) == ("mismatched", (1,))
    assert {f.ranks for f in CollectiveHang(CFG).check(100.0, v)} <= {(1,)}


def test_signatures_fold_by_group_and_seq_and_stay_bounded():
    first = t.view(job(history()), now=100.0)
    moved = [t.rank(r, world_size=WORLD, recent_colls=(t.sig(4, state="completed"),)) for r in range(WORLD)]
    v = t.view(moved, now=101.0, base=first, seq=2)
    assert [c.state for c, _ in v.ranks[0].colls] == ["scheduled"] * 3 + ["completed"]
    many = [t.rank(r, world_size=WORLD, recent_colls=tuple(t.sig(s) for s in range(5, 37))) for r in range(WORLD)]
    v = t.view(many, now=102.0, base=v, seq=3)
    assert len(v.ranks[0].colls) == COLL_HISTORY and v.ranks[0].colls[-1][0].seq == 36


def report_with(colls) -> dict:
    d = json.loads(json.dumps(t.report("h", [t.rank(0, world_size=1)]).to_dict()))  # as it comes off the wire
    d["ranks"][0]["recent_colls"] = colls
    return d


GOOD = {"group": 0, "seq": 1, "op": "all_reduce", "elements": 4, "dtype": "float32", "shape": [4], "age_s": 0.1}


@pytest.mark.parametrize(
    "bad",
    [
        "not a list",
        [GOOD] * 33,
        [{**GOOD, "seq": 0}],
        [{**GOOD, "seq": -3}],
        [{**GOOD, "elements": 1 << 63}],
        [{**GOOD, "group": 1 << 64}],
        [{**GOOD, "op": "x" * 100}],
        [{**GOOD, "shape": [1] * 9}],
        [{**GOOD, "shape": ["a"]}],
        [{**GOOD, "age_s": float("nan")}],
        [{**GOOD, "seq": True}],
        [{k: v for k, v in GOOD.items() if k != "dtype"}],
    ],
)
def test_hostile_signatures_are_refused_with_a_clear_error(bad):
    with pytest.raises(ReportError, match="recent_colls"):
        HostReport.from_dict(report_with(bad))
    dropped: list = []
    assert HostReport.from_dict(report_with(bad), dropped).ranks == () and dropped  # that rank only


def test_signatures_round_trip_through_the_report():
    got = HostReport.from_dict(report_with([GOOD, {**GOOD, "seq": 2, "shape": None}])).ranks[0].recent_colls
    assert [(c.seq, c.shape) for c in got] == [(1, (4,)), (2, None)]


def test_a_tie_in_the_flight_recorder_gives_way_to_hook_marks_that_name_the_odd_rank():
    """Seen on a real gloo job: rank 0 aborted in gloo's I/O thread before its FR was
    read, so FR held rank 1 (odd) and rank 2 only; every rank's hook marks were there."""
    colls = history({1: {"elements": 1000}})
    colls[0] = colls[0][:-1]
    marks = {r: {"collective": t.coll(seq=9, outstanding=1, nbytes=4000 if r == 1 else 16)} for r in range(WORLD)}
    (f,) = check(job(colls, marks))
    assert f.ranks == (1,) and f.evidence["source"] == "hook"


def test_signatures_arriving_rank_by_rank_never_accuse_early():
    """Seen on a real run: the odd rank's signature and one healthy rank's arrived
    first (a tie), the third a report later. Nothing until a majority of the
    group agrees; then the odd rank."""
    colls = history({1: {"elements": 6}})
    early = job([colls[0], colls[1], colls[2][:-1]])  # rank 2 has not reported #4 yet
    assert check(early) == []
    (f,) = check(job(colls))
    assert f.ranks == (1,)


def test_two_odd_ranks_seen_before_the_usual_ones_are_not_taken_for_the_majority():
    world = 5
    colls = history({1: {"elements": 6}, 3: {"elements": 6}}, world=world)
    partial = [c if r in (0, 1, 3) else c[:-1] for r, c in enumerate(colls)]  # 2 odd + 1 usual so far
    assert check(job(partial)) == []
    (f,) = check(job(colls))
    assert f.ranks == (1, 3)


class _Shape(TypedDict, total=False):
    """What another shape of a collective differs in (t.sig's arguments)."""

    elements: int
    dtype: str
    op: str


def _fr_reference(view):
    """mismatch._fr as it was: a pass over every rank object."""
    first: dict[tuple, object] = {}
    differ = set()
    for rv in view.ranks.values():
        for key, sig, _ in rv.coll_keys:
            f = first.setdefault(key, sig)
            if f is not sig and f != sig:
                differ.add(key)
    out: dict[tuple, dict[int, tuple]] = {}
    if not differ:
        return out
    for r, rv in view.ranks.items():
        for (key, sig, at), (c, _) in zip(rv.coll_keys, rv.colls, strict=False):
            if key in differ:
                out.setdefault(key, {})[r] = (sig, c.describe(), at)
    return out


def test_the_flight_recorder_signatures_read_only_the_ranks_that_hold_some():
    """mismatch._fr reads only the ranks whose fr_held column is set: the same
    keys, entries and order as the pass over every rank, on random views where
    some ranks have no Flight Recorder entries, some only an older or newer
    stretch, and some issued another shape; also as ranks restart (new pids)."""
    import random

    from watchdog.coordinator.analysis import mismatch

    rng = random.Random(7)
    shapes: tuple[_Shape, ...] = ({}, {"elements": 6}, {"dtype": "bfloat16"}, {"op": "broadcast"})
    differed = 0
    for trial in range(200):
        world = rng.choice((1, 3, 8, 17))
        view = None
        for tick in range(3):
            states = []
            for r in range(world):
                colls: tuple[CollSig, ...]
                if rng.random() < 0.4:
                    colls = ()
                else:
                    lo = rng.randrange(1, 5)
                    colls = tuple(
                        t.sig(s, age_s=float(10 - s), **(rng.choice(shapes) if rng.random() < 0.1 else _Shape()))
                        for s in range(lo, lo + rng.randrange(1, 6))
                    )
                pid = 1000 + r + (100 if rng.random() < 0.1 else 0)
                states.append(t.rank(r, world_size=world, pid=pid, recent_colls=colls))
            view = t.view(states, now=100.0 + tick, base=view, seq=trial * 3 + tick + 1)
            got, want = mismatch._fr(view), _fr_reference(view)
            assert got == want and [list(v) for v in got.values()] == [list(v) for v in want.values()], (trial, tick)
            differed += bool(want)
    assert differed > 50
