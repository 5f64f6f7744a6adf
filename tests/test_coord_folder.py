"""The coordinator's in-place ``Folder`` gives the same views as the pure
``fold`` (which copies the view per report), report by report: joins,
progress, deaths, restarts, stale incarnations, retried reports, learned world
size, and an agent restart; and the columns it keeps as it folds are those the
pure view's ranks give (view/columns.py)."""

from __future__ import annotations

import random

from watchdog.coordinator import testing as t
from watchdog.coordinator.view import columns
from watchdog.coordinator.view.cluster import Folder, empty, fold


def assert_same_columns(snapshot, pure):
    kept = columns.cached(snapshot)
    assert kept is not None  # the Folder's own, not built from the ranks
    built = columns.build(pure)
    for name in columns.NAMES:
        assert list(getattr(kept, name)) == list(getattr(built, name)), name


def reports():
    """A mixed stream of host reports, with their arrival times."""
    out = []
    for i in range(1, 6):
        states = t.healthy(8, step=10 * i, recent_steps=t.steps(10 * i - 9, 10))
        if i >= 3:
            states = t.with_rank(states, 2, alive=False, gone_age_s=0.2)
        if i >= 4:
            states = t.with_rank(states, 5, pid=7777, proc_start_us=1_800_000_000_000_000, step=1)  # restarted
        for h in (0, 1):
            out.append((100.0 + i, t.report(f"host{h}", states[4 * h : 4 * h + 4], seq=i)))
    out.append((106.0, t.report("host0", t.healthy(8)[:4], seq=2)))  # retried: already folded
    old = t.with_rank(t.healthy(8), 5, pid=1005, proc_start_us=1_000)  # an older incarnation, elsewhere
    out.append((106.5, t.report("host9", old[5:6], seq=1)))
    out.append((107.0, t.report("host1", t.healthy(8)[4:], seq=1, agent_id="agent-restarted")))
    out.append((108.0, t.report("host2", t.healthy(16)[8:12], seq=1)))  # world size grows
    return out


def test_folder_matches_fold_report_by_report():
    for world in (0, 8):
        pure = empty("job", world)
        folder = Folder(empty("job", world))
        for now, rep in reports():
            pure, ev1 = fold(pure, rep, now)
            ev2 = folder.fold(rep, now)
            assert ev1 == ev2
            assert folder.snapshot() == pure
            assert_same_columns(folder.snapshot(), pure)


def test_folder_matches_fold_on_random_streams():
    rng = random.Random(3)
    for _ in range(20):
        pure, folder = empty("job", 0), Folder(empty("job", 0))
        seqs: dict[str, int] = {}
        now = 100.0
        for _ in range(40):
            now += rng.uniform(0.0, 0.5)
            h = rng.randrange(4)
            host = f"host{h}"
            seqs[host] = seqs.get(host, 0) + rng.choice((1, 1, 1, 0, -1))  # some retried or reordered
            step = int(now * 4)
            states = [
                t.rank(
                    r,
                    world_size=16,
                    step=step,
                    recent_steps=t.steps(step - 3, 3),
                    alive=rng.random() > 0.05,
                    pid=1000 + r + 100 * rng.randrange(2),
                    heartbeat_age_s=rng.uniform(0, 4),
                    collective=t.coll(seq=step + 1, outstanding=1, since_s=rng.uniform(0, 2)),
                )
                for r in range(4 * h, 4 * h + 4)
            ]
            rep = t.report(host, states, seq=seqs[host])
            pure, ev1 = fold(pure, rep, now)
            assert folder.fold(rep, now) == ev1
            assert folder.snapshot() == pure
            assert_same_columns(folder.snapshot(), pure)


def test_snapshot_is_immutable_and_cached():
    folder = Folder(empty("job", 8))
    folder.fold(t.report("host0", t.healthy(8)[:4]), 100.0)
    first = folder.snapshot()
    assert folder.snapshot() is first  # nothing folded since: the same view
    folder.fold(t.report("host1", t.healthy(8)[4:]), 100.5)
    second = folder.snapshot()
    assert len(first.ranks) == 4 and len(second.ranks) == 8  # the earlier view did not change
