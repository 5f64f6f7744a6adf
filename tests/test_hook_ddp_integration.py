"""The hook in a real 2-rank DDP job (torchrun, gloo on loopback), read back from
the slot files the way the agent reads them. Rank 1's input pipeline is slow:
its time goes to data wait, and rank 0's to waiting in the all-reduce for it."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from watchdog.contracts import slot as wire
from watchdog.hook.testing import ENV_VARS, records_of, step_splits

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
SLOW_DATA_S = 0.03

SCRIPT = textwrap.dedent(
    f"""
    import gc, os, time
    import torch, torch.distributed as dist
    from torch import nn
    from watchdog.hook import install

    torch.set_num_threads(1)
    mon = install()
    rank = int(os.environ["RANK"])
    with mon.phase("init"):
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    mon.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def batches():
        for _ in range({STEPS}):
            if rank == 1:
                time.sleep({SLOW_DATA_S})  # this rank's input pipeline is slow
            yield torch.randn(4, 8), torch.randn(4, 1)

    for x, y in mon.wrap_loader(batches()):
        time.sleep(0.005)  # "compute"
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        mon.step()
    # Both ranks off the wire before either tears gloo down (a rank that destroys while its peer is
    # still finishing the last ring all-reduce can SIGABRT it). Through the store, not dist.barrier(),
    # so the hook's record still ends with DDP's all-reduce.
    store = dist.distributed_c10d._get_default_store()
    store.add("finished", 1)
    while store.add("finished", 0) < 2:
        time.sleep(0.01)
    # DDP's reducer holds the process group: left alive, gloo's worker threads end only at interpreter
    # finalization, where destroying them could abort the process ("terminate called without an active
    # exception"). Freed here, the group ends while the interpreter is whole (cycles need the collect).
    del model, opt, store
    gc.collect()
    dist.destroy_process_group()
    mon.close()
    """
)


@pytest.fixture(scope="module")
def slots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    run_dir = tmp / "run"
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        WATCHDOG_RUN_DIR=str(run_dir),
        WATCHDOG_JOB_NAME="ddp-test",
        WATCHDOG_HEARTBEAT_INTERVAL_S="0.1",
        OMP_NUM_THREADS="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    snaps = [wire.read_slot(p) for p in wire.list_slot_files(str(run_dir))]
    return {s.header.identity.rank: s for s in snaps}


def test_each_rank_has_a_slot_with_its_identity(slots):
    assert sorted(slots) == [0, 1]
    for rank, snap in slots.items():
        ident = snap.header.identity
        assert (ident.job, ident.world_size, ident.local_rank) == ("ddp-test", 2, rank)
        assert ident.run_id.endswith(":0")  # torchrun's run id, restart 0
        assert snap.header.status == wire.Status.EXITED
        assert not snap.torn


def test_steps_and_collective_sequence_agree_across_ranks(slots):
    for snap in slots.values():
        h = snap.header
        assert h[wire.H_STEP] == STEPS
        assert (h[wire.H_COLL_GROUP], h[wire.H_COLL_OP]) == (0, wire.CollOp.DDP_ALL_REDUCE)
        assert h[wire.H_COLL_DONE_SEQ] == h[wire.H_COLL_SEQ] and h[wire.H_COLL_OUTSTANDING] == 0
    seqs = {r: [s.last_coll_seq for s in step_splits(snap)] for r, snap in slots.items()}
    assert seqs[0] == seqs[1]  # the same all-reduce #k in the same step on every rank
    assert seqs[0] == sorted(seqs[0]) and seqs[0][-1] == slots[0].header[wire.H_COLL_SEQ] >= STEPS
    per_step = {r: {s.collectives for s in step_splits(snap)} for r, snap in slots.items()}
    assert per_step[0] == per_step[1] and len(per_step[0]) == 1  # buckets per step: constant


def test_step_time_splits_into_data_collective_compute(slots):
    for snap in slots.values():
        splits = step_splits(snap)
        assert len(splits) == STEPS
        for s in splits:
            # waits are parts of the step: what remains (compute) is never negative
            assert s.data_ns > 0 and s.coll_ns > 0 and s.data_ns + s.coll_ns <= s.step_ns, s
            assert s.data_waits == 1
        assert snap.header[wire.H_TOTAL_STEP_NS] == sum(s.step_ns for s in splits)
        assert snap.header[wire.H_TOTAL_DATA_NS] == sum(s.data_ns for s in splits)
        assert snap.header[wire.H_TOTAL_COLL_NS] == sum(s.coll_ns for s in splits)
    slow = statistics.median(s.data_ns for s in step_splits(slots[1]))
    assert slow >= SLOW_DATA_S * 1e9 * 0.9  # rank 1 waits on its loader...
    waits_for_it = statistics.median(s.coll_ns for s in step_splits(slots[0])[1:])
    assert waits_for_it >= SLOW_DATA_S * 1e9 * 0.3  # ...and rank 0 waits in the all-reduce for rank 1
    assert waits_for_it > statistics.median(s.coll_ns for s in step_splits(slots[1])[1:])


def test_process_group_and_phase_history(slots):
    for snap in slots.values():
        pg = [r.payload[0] for r in records_of(snap, wire.RecordKind.PG)]
        assert pg == [wire.PgState.INITIALIZING, wire.PgState.JOINED, wire.PgState.DESTROYED]
        phases = [r.payload[0] for r in records_of(snap, wire.RecordKind.PHASE)]
        assert phases == [wire.Phase.INIT, wire.Phase.TRAIN]
        assert snap.header[wire.H_HOOK_ERRORS] == 0
