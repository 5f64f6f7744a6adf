"""The view's columns (view/columns.py) hold each rank's own values, in the view's
rank order, once per view object: what the detectors read instead of the ranks'
objects must be exactly what those objects say."""

from __future__ import annotations

import random
from array import array
from dataclasses import replace

from watchdog.coordinator import testing as t
from watchdog.coordinator.view import columns
from watchdog.coordinator.view.cluster import ClusterView, FoldedRank, Folder, empty
from watchdog.stepstats.steps import FLAT_FIELDS


def _expected(rv: FoldedRank) -> dict:
    s, st = rv.state, rv.step_stats
    return {
        "rank": rv.rank,
        "host": rv.host,
        "status": s.status,
        "alive": s.alive,
        "proc_status": s.proc_status,
        "heartbeat_age_s": s.heartbeat_age_s,
        "heartbeat_moved": rv.heartbeat_moved,
        "pid": s.pid,
        "proc_start_us": s.proc_start_us,
        "world_size": s.world_size,
        "pg_state": s.pg_state,
        "phase": s.phase,
        "step": s.step,
        "received_at": rv.received_at,
        "registered_at": rv.registered_at,
        "progress_at": rv.progress_at,
        "step_start": rv.step_start(),
        "coll_group": s.coll.group,
        "coll_seq": s.coll.seq,
        "coll_done_seq": s.coll.done_seq,
        "coll_outstanding": s.coll.outstanding,
        "coll_enter": rv.coll_enter(),
        "coll_op": s.coll.op,
        "coll_bytes": s.coll.bytes,
        "steps_seen": st.steps_seen,
        "has_history": bool(st.history),
        "p99_step_s": st.p99_step_s,
        "loss_step": s.loss_step,
        "loss_bad_step": s.loss_bad_step,
        "loss_calm": rv.loss_calm,
        # -- for perf
        "split_clock": rv.split_clock,
        "history": rv.history,
        "windows": rv.windows,
        "train_steps": rv.train_steps,
        "data_share": rv.data_share,
        "batch_per_rank": s.batch_per_rank,
        "oncpu_share": s.oncpu_share,
        "runq_share": s.runq_share,
        # -- for hang
        "fr_held": bool(rv.colls or s.fr_newest_seq),
        # -- for goodput
        "step_history": st.history,
        "step_flat": st.flat if st.flat_of is st.history else array("d"),
        "step_newest": st.flat[-FLAT_FIELDS] if st.flat_of is st.history and st.flat else float("-inf"),
        "frame": s.frame,
        "frame_step": s.frame_step,
    }


def _random_view(rng: random.Random, n: int) -> ClusterView:
    states = [
        t.rank(
            r,
            world_size=n,
            step=rng.randrange(0, 50),
            status=rng.choice(("running", "exited", "disabled")),
            alive=rng.random() > 0.2,
            heartbeat_age_s=rng.uniform(0, 30),
            step_age_s=rng.uniform(0, 5),
            phase=rng.choice(("train", "eval", "init")),
            in_data_wait=rng.random() < 0.3,
            proc_status=rng.choice(("running", "stopped", "")),
            collective=t.coll(
                group=rng.choice((0, 7)),
                seq=10,
                done_seq=rng.choice((9, 10)),
                outstanding=rng.choice((0, 1)),
                since_s=rng.uniform(0, 9),
                op=rng.choice(("all_reduce", "broadcast")),
            ),
            recent_steps=t.steps(1, rng.randrange(0, 120), step_s=rng.uniform(0.05, 0.2), data_s=rng.uniform(0, 0.05)),
            # the accelerator's clock: none, keeping up, or stale (so the split is the CPU's again)
            recent_gpu=t.gpu_steps(rng.choice((1, 40)), rng.choice((0, 0, 30, 80)), step_s=rng.uniform(0.05, 0.2)),
            batch_per_rank=rng.choice((0, 16, 32)),
            loss_step=rng.choice((0, 40)),
            loss_bad_step=rng.choice((0, 0, 38)),
            frame=rng.choice(("", "upload_metrics (train.py:21)")),
            frame_step=rng.choice((0, 12)),
        )
        for r in rng.sample(range(n), n)  # ranks in no particular order
    ]
    return t.view(states, now=100.0, received={"host1": 97.5})


def test_columns_are_each_ranks_values_in_the_views_order():
    rng = random.Random(5)
    clocks, windows = set(), 0
    for trial in range(20):
        view = _random_view(rng, rng.randrange(1, 40))
        cols = columns.of(view)
        assert list(cols.rank) == list(view.ranks)
        assert len(cols) == len(view.ranks)
        for i, rv in enumerate(view.ranks.values()):
            got = {name: getattr(cols, name)[i] for name in columns.NAMES}
            assert got == _expected(rv), (trial, rv.rank)
            clocks.add(rv.split_clock)
            windows += bool(rv.windows)
    assert clocks == {"cpu", "gpu"} and windows  # both clocks' splits, and closed straggler windows, compared


def test_columns_are_built_once_per_view_object_and_not_shared_by_another():
    view = _random_view(random.Random(1), 8)
    assert columns.of(view) is columns.of(view)
    later = replace(view, behind_s=2.0)  # the coordinator's view_at makes such copies
    assert columns.of(later) is not columns.of(view)
    assert [list(getattr(columns.of(later), n)) for n in columns.NAMES] == [
        list(getattr(columns.of(view), n)) for n in columns.NAMES
    ]
    assert later == replace(view, behind_s=2.0)  # the cache is not part of the view's value


def test_an_empty_view_has_empty_columns():
    for view in (t.view([]), empty("job", 8)):  # the Folder's, and one built
        cols = columns.of(view)
        assert len(cols) == 0 and all(len(getattr(cols, n)) == 0 for n in columns.NAMES)


def test_a_value_no_array_holds_makes_the_folder_fall_back_to_building_them():
    folder = Folder(empty("job", 0))
    folder.fold(t.report("host0", t.healthy(4)), 100.0)
    assert columns.cached(folder.snapshot()) is not None
    huge = t.with_rank(t.healthy(4), 1, pid=1 << 70)  # never past validation; still no crash
    folder.fold(t.report("host0", huge, seq=2), 101.0)
    view = folder.snapshot()
    assert columns.cached(view) is None
    assert columns.of(view).pid[1] == 1 << 70
