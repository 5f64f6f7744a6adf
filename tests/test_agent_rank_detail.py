"""Per-rank detail on the agent's /metrics (--metrics.rank-detail): summary keeps
the per-rank series of every rank that is not alive and running and of the K
slowest, full keeps all; the host aggregates are there either way and agree
with the per-rank series they summarise."""

from __future__ import annotations

import pytest
from prometheus_client.core import Metric

from watchdog import flags
from watchdog.agent import config, testing
from watchdog.agent.export import metrics as m
from watchdog.agent.export import rankmetrics
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import slot as wire

MS = 1_000_000
NOW = 10_000 * MS


def rank(r: int, compute_ms: int, *, alive=True, status="running", state=slot_states.ALIVE, step=100) -> LocalRank:
    ident = testing.identity("train", r, 16, pid=1000 + r, proc_start_us=1)
    words = {
        wire.H_STEP: step,
        wire.H_LAST_STEP_NS: (compute_ms + 30) * MS,
        wire.H_LAST_DATA_NS: 10 * MS,
        wire.H_LAST_COLL_NS: 20 * MS,
        wire.H_TOTAL_STEP_NS: step * (compute_ms + 30) * MS,
        wire.H_TOTAL_DATA_NS: step * 10 * MS,
        wire.H_TOTAL_COLL_NS: step * 20 * MS,
    }
    snap = testing.snapshot(ident, words, path=f"/run/{r}.slot")
    return LocalRank(snap.path, snap.header, NOW - r * MS, False, ProcSample(alive, status), state, 0.0, ())


def samples(fams: list[Metric], name: str) -> list:
    return [s for f in fams for s in f.samples if s.name == name]


def ranks_shown(fams: list[Metric]) -> set[int]:
    return {int(s.labels["rank"]) for s in samples(fams, "watchdog_rank_alive")}


def host_job() -> list[LocalRank]:
    views = [rank(r, 100 + r % 3) for r in range(8)]  # healthy, computing 100-102 ms
    views[5] = rank(5, 130)  # the slowest
    views[6] = rank(6, 120)  # the second slowest
    views[1] = rank(1, 100, alive=False, state=slot_states.DEAD)
    views[2] = rank(2, 100, status="stopped")
    views[3] = rank(3, 100, state=slot_states.EXITED, step=80)
    return views


def test_summary_keeps_every_rank_not_running_and_the_k_slowest():
    fams = rankmetrics.rank_families(host_job(), "h1", NOW, rankmetrics.SUMMARY, slowest=2)
    assert ranks_shown(fams) == {1, 2, 3, 5, 6}
    per_rank = [s for f in fams for s in f.samples if "rank" in s.labels]
    assert len(per_rank) == 5 * m.SERIES_PER_RANK
    fams = rankmetrics.rank_families(host_job(), "h1", NOW, rankmetrics.SUMMARY, slowest=1)
    assert ranks_shown(fams) == {1, 2, 3, 5}


def test_summary_keeps_a_rank_frozen_with_its_process_running():
    # Frozen in a native call holding the GIL: alive, running, not the slowest by
    # its last step, but its heartbeat stopped. RankWatchdogRankFrozen reads its
    # per-rank series, so summary detail must keep them.
    views = host_job()
    frozen = views[4]
    views[4] = LocalRank(frozen.path, frozen.header, NOW - 8_000 * MS, False, frozen.proc, frozen.state, 0.0, ())
    fams = rankmetrics.rank_families(views, "h1", NOW, rankmetrics.SUMMARY, slowest=1)
    assert ranks_shown(fams) == {1, 2, 3, 4, 5}
    (age,) = [s.value for s in samples(fams, "watchdog_rank_heartbeat_age_seconds") if s.labels["rank"] == "4"]
    assert age == pytest.approx(8.0)


def test_full_keeps_every_rank():
    fams = rankmetrics.rank_families(host_job(), "h1", NOW)
    assert ranks_shown(fams) == set(range(8))


@pytest.mark.parametrize("detail", rankmetrics.DETAILS)
def test_host_aggregates_are_exported_at_every_detail_and_add_up(detail):
    fams = rankmetrics.rank_families(host_job(), "h1", NOW, detail, slowest=2)
    lab = {"training_job": "train", "host": "h1"}
    states = {s.labels["state"]: s.value for s in samples(fams, "watchdog_host_ranks")}
    assert states == {"alive": 5, "stopped": 1, "dead": 1, "exited": 1}
    (steps,) = samples(fams, "watchdog_host_steps_total")
    assert steps.labels == lab and steps.value == 7 * 100 + 80
    parts = {s.labels["part"]: s.value for s in samples(fams, "watchdog_host_step_part_seconds_total")}
    assert parts["data"] == pytest.approx(780 * 0.010) and parts["collective"] == pytest.approx(780 * 0.020)
    assert samples(fams, "watchdog_host_step_min")[0].value == 80
    assert samples(fams, "watchdog_host_step_max")[0].value == 100
    assert samples(fams, "watchdog_host_last_step_compute_max_seconds")[0].value == pytest.approx(0.130)
    # The oldest heartbeat among live ranks: rank 7's (the dead one's is not a heartbeat problem).
    assert samples(fams, "watchdog_host_heartbeat_age_max_seconds")[0].value == pytest.approx(0.007)
    host_series = [s for f in fams for s in f.samples if s.name.startswith("watchdog_host_")]
    assert len(host_series) == m.HOST_SERIES


def test_the_flags_choose_the_detail_and_refuse_others():
    cfg = config.load(["--metrics.rank-detail", "summary", "--metrics.slowest-ranks", "4"], {})
    assert cfg.rank_detail == "summary" and cfg.slowest_ranks == 4
    assert config.load([], {}).rank_detail == "full"
    with pytest.raises(flags.FlagError, match="rank-detail='some': must be full or summary"):
        config.load(["--metrics.rank-detail", "some"], {})
    with pytest.raises(ValueError):
        rankmetrics.RanksCollector(lambda: (), "h", detail="some")


def slot(r: int, world: int, created_s: int, *, alive=True, state=slot_states.ALIVE, job="train") -> LocalRank:
    ident = testing.identity(job, r, world, pid=2000 + r + 10 * world, proc_start_us=created_s)
    snap = testing.snapshot(ident, wall_ns=created_s * 1_000_000_000, path=f"/run/{job}.{world}.{r}.slot")
    return LocalRank(snap.path, snap.header, NOW, False, ProcSample(alive, "running"), state, 0.0, ())


@pytest.mark.parametrize("detail", rankmetrics.DETAILS)
def test_the_world_size_is_the_newest_live_incarnations(detail):
    # An elastic shrink 4 -> 2: this host's old ranks 2-3 were retired (one exited,
    # one killed by the launcher) and it now runs rank 1 of the new world.
    retired = [slot(2, 4, 100, state=slot_states.EXITED), slot(3, 4, 100, alive=False, state=slot_states.DEAD)]
    fams = rankmetrics.rank_families([*retired, slot(1, 2, 200)], "h1", NOW, detail)
    assert [(s.labels["training_job"], s.value) for s in samples(fams, "watchdog_job_world_size")] == [("train", 2)]
    # A newer slot whose process is gone does not outrank a live one (a rank of a
    # later attempt that died at once; the live rank is still the job's world).
    fams = rankmetrics.rank_families([slot(1, 2, 200), slot(0, 8, 300, alive=False, state=slot_states.DEAD)], "h1", NOW)
    assert [s.value for s in samples(fams, "watchdog_job_world_size")] == [2]
    # No live rank (the job ended here): the newest slot's, whatever the order read.
    fams = rankmetrics.rank_families([slot(1, 2, 200, state=slot_states.EXITED), *retired], "h1", NOW)
    assert [s.value for s in samples(fams, "watchdog_job_world_size")] == [2]
    # One series per job.
    fams = rankmetrics.rank_families([slot(0, 4, 100), slot(0, 3, 100, job="eval")], "h1", NOW)
    got = {s.labels["training_job"]: s.value for s in samples(fams, "watchdog_job_world_size")}
    assert got == {"train": 4, "eval": 3}
