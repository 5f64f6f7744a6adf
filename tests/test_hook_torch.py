"""The torch features against real torch.distributed: a single-process gloo group
(world size 1) exercises the patched collectives, process-group marks, DDP's
comm hook and the optimizer auto-step without spawning anything."""

from __future__ import annotations

import inspect
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed unavailable", allow_module_level=True)

from torch import nn  # noqa: E402

from watchdog.contracts import slot as wire  # noqa: E402
from watchdog.contracts.slot import CollOp, PgState, RecordKind  # noqa: E402
from watchdog.hook.testing import ENV_VARS, installed, read_monitor, records_of, step_splits  # noqa: E402

NAMES = ("all_reduce", "broadcast", "barrier", "all_gather", "init_process_group", "destroy_process_group")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def init(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)


@pytest.fixture
def mon(tmp_path):
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as m:
        init(tmp_path)
        yield m


def header(mon):
    return read_monitor(mon).header


def test_process_group_lifecycle_is_recorded(tmp_path):
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        assert header(mon)[wire.H_PG_STATE] == PgState.NONE
        init(tmp_path)
        assert header(mon)[wire.H_PG_STATE] == PgState.JOINED
        dist.destroy_process_group()
        assert header(mon)[wire.H_PG_STATE] == PgState.DESTROYED
        states = [r.payload[0] for r in records_of(read_monitor(mon), RecordKind.PG)]
        assert states == [PgState.INITIALIZING, PgState.JOINED, PgState.DESTROYED]


@pytest.mark.filterwarnings("ignore:Device capability")
def test_failed_init_goes_back_to_none(tmp_path):
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        with pytest.raises(Exception):
            dist.init_process_group("no-such-backend", init_method=f"file://{tmp_path}/s", rank=0, world_size=1)
        states = [r.payload[0] for r in records_of(read_monitor(mon), RecordKind.PG)]
        assert states == [PgState.INITIALIZING, PgState.NONE]


def test_group_already_joined_at_install(tmp_path):
    init(tmp_path)
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        assert header(mon)[wire.H_PG_STATE] == PgState.JOINED


def test_a_group_made_past_the_wrapper_is_seen_at_the_next_heartbeat(tmp_path):
    """A framework holding init_process_group from before install (or its own path to
    the default group): the wrapper never runs, the heartbeat sees the group; a
    failed or destroyed group is never read as joined."""
    plain = dist.init_process_group
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        assert dist.init_process_group is not plain
        mon._poll_background()
        assert header(mon)[wire.H_PG_STATE] == PgState.NONE
        plain("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        assert header(mon)[wire.H_PG_STATE] == PgState.NONE  # not seen by the wrapper
        mon._poll_background()
        assert header(mon)[wire.H_PG_STATE] == PgState.JOINED
        dist.destroy_process_group()
        mon._poll_background()
        assert header(mon)[wire.H_PG_STATE] == PgState.DESTROYED
        assert mon.errors == 0


@pytest.mark.parametrize(
    ("word", "initialized", "after"),
    [
        (PgState.NONE, True, PgState.JOINED),
        (PgState.DESTROYED, True, PgState.JOINED),  # made again past the wrapper
        (PgState.NONE, False, None),
        (PgState.INITIALIZING, True, None),  # inside our wrapper: it says joined itself
        (PgState.JOINED, True, None),
    ],
)
def test_joined_poll_table(word, initialized, after):
    from watchdog.hook.zero_code.collectives import joined_poll

    words = {wire.H_PG_STATE: int(word)}
    said: list[PgState] = []
    joined_poll(lambda: initialized, words, said.append)()
    assert said == ([] if after is None else [after])


def test_patched_functions_keep_their_signature_and_are_restored(tmp_path):
    originals = {n: getattr(dist, n) for n in NAMES}
    with installed(tmp_path / "run", heartbeat_interval_s=3600):
        for n in NAMES:
            assert getattr(dist, n) is not originals[n]
            assert getattr(dist.distributed_c10d, n) is getattr(dist, n)
            assert inspect.signature(getattr(dist, n)) == inspect.signature(originals[n])
    for n in NAMES:
        assert getattr(dist, n) is originals[n] and getattr(dist.distributed_c10d, n) is originals[n]


def test_not_patched_when_switched_off(tmp_path):
    original = dist.all_reduce
    with installed(tmp_path / "run", patch_collectives=False):
        assert dist.all_reduce is original


def test_sync_all_reduce_is_marked_with_seq_op_bytes(mon):
    t = torch.ones(16)  # 64 bytes
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_reduce(t, dist.ReduceOp.SUM, None)  # group given positionally
    dist.all_reduce(t, group=dist.group.WORLD)  # the default group, named: same counter
    assert torch.equal(t, torch.ones(16))  # world size 1: the call really happened, unchanged
    h = header(mon)
    assert (h[wire.H_COLL_GROUP], h[wire.H_COLL_SEQ], h[wire.H_COLL_DONE_SEQ]) == (0, 5, 5)
    assert (h[wire.H_COLL_OP], h[wire.H_COLL_BYTES], h[wire.H_COLL_OUTSTANDING]) == (CollOp.ALL_REDUCE, 64, 0)
    assert h[wire.H_COLL_EXIT_NS] >= h[wire.H_COLL_ENTER_NS] > 0
    mon.step()
    (s,) = step_splits(read_monitor(mon))
    assert s.collectives == 5 and s.last_coll_seq == 5 and 0 < s.coll_ns <= s.step_ns
    assert mon.errors == 0


def test_other_collectives_have_their_op_and_size(mon):
    t = torch.ones(4, dtype=torch.float64)  # 32 bytes
    dist.broadcast(t, src=0)
    assert (header(mon)[wire.H_COLL_OP], header(mon)[wire.H_COLL_BYTES]) == (CollOp.BROADCAST, 32)
    out = [torch.empty(4, dtype=torch.float64)]
    dist.all_gather(out, t)
    assert (header(mon)[wire.H_COLL_OP], header(mon)[wire.H_COLL_BYTES]) == (CollOp.ALL_GATHER, 32)
    dist.barrier()
    h = header(mon)
    assert (h[wire.H_COLL_OP], h[wire.H_COLL_BYTES], h[wire.H_COLL_SEQ]) == (CollOp.BARRIER, 0, 3)


def test_subgroup_has_its_own_key_and_sequence(mon):
    sub = dist.new_group([0])
    name = dist.distributed_c10d._get_process_group_name(sub)
    dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1), group=sub)
    h = header(mon)
    assert h[wire.H_COLL_GROUP] == wire.group_key(name) != 0
    assert h[wire.H_COLL_SEQ] == 1
    dist.all_reduce(torch.ones(1))
    assert (header(mon)[wire.H_COLL_GROUP], header(mon)[wire.H_COLL_SEQ]) == (0, 2)


def test_async_op_exits_when_the_work_completes(mon):
    work = dist.all_reduce(torch.ones(1024), async_op=True)
    assert work is not None
    work.wait()
    deadline = time.monotonic() + 10
    while header(mon)[wire.H_COLL_OUTSTANDING] and time.monotonic() < deadline:
        time.sleep(0.005)  # the exit runs in the future's callback, on gloo's thread
    h = header(mon)
    assert (h[wire.H_COLL_OUTSTANDING], h[wire.H_COLL_DONE_SEQ], h[wire.H_COLL_SEQ]) == (0, 1, 1)
    assert mon.errors == 0


def test_a_collective_that_raises_propagates_and_the_rank_is_seen_inside_it(mon):
    """A rank that dies of a collective's error (a peer gone) must read as dead
    inside that collective, not as one that never entered it (the culprit's
    place): the header keeps "in #1, not completed"; the counters move on, so a
    rank that catches the error and goes on is numbered right again."""
    with pytest.raises(Exception) as info:
        dist.all_reduce("not a tensor")
    assert "watchdog" not in repr(info.value)
    h = header(mon)
    assert (h[wire.H_COLL_SEQ], h[wire.H_COLL_DONE_SEQ], h[wire.H_COLL_OUTSTANDING]) == (1, 0, 1)
    dist.all_reduce(torch.ones(1))
    h = header(mon)
    assert (h[wire.H_COLL_SEQ], h[wire.H_COLL_DONE_SEQ], h[wire.H_COLL_OUTSTANDING]) == (2, 2, 0)
    assert mon.errors == 0


def ddp_steps(mon, model, steps, width=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, width), torch.randn(8, 1)
    for _ in mon.wrap_loader(range(steps)):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        mon.step()


def test_ddp_bucket_all_reduce_is_counted_once(mon):
    """torch's allreduce_hook calls dist.all_reduce, which install() patched: the
    bucket must be one DDP_ALL_REDUCE, not that plus an ALL_REDUCE."""
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    mon.watch_ddp(model)
    ddp_steps(mon, model, 3)
    splits = step_splits(read_monitor(mon))
    assert [s.collectives for s in splits] == [1, 1, 1]
    assert [s.last_coll_seq for s in splits] == [1, 2, 3]
    h = header(mon)
    assert h[wire.H_COLL_OP] == CollOp.DDP_ALL_REDUCE and h[wire.H_COLL_BYTES] == 5 * 4
    assert h[wire.H_COLL_DONE_SEQ] == 3 and h[wire.H_COLL_OUTSTANDING] == 0
    dist.all_reduce(torch.ones(1))  # a direct call on the same group continues its sequence
    assert header(mon)[wire.H_COLL_SEQ] == 4
    assert mon.errors == 0


def test_ddp_with_several_buckets_counts_each_bucket(mon):
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 1)), bucket_cap_mb=0.01
    )
    mon.watch_ddp(model)
    ddp_steps(mon, model, 4, width=64)
    splits = step_splits(read_monitor(mon))
    per_step = {s.collectives for s in splits[1:]}  # DDP may rebuild its buckets after step 1
    (buckets,) = per_step
    assert buckets >= 2
    assert splits[-1].last_coll_seq == sum(s.collectives for s in splits)
    assert all(0 < s.coll_ns <= s.step_ns for s in splits)  # overlapping buckets: their union
    h = header(mon)
    assert h[wire.H_COLL_OUTSTANDING] == 0 and h[wire.H_COLL_DONE_SEQ] == h[wire.H_COLL_SEQ]


def test_ddp_gradients_are_unchanged_by_the_hook(tmp_path):
    torch.manual_seed(0)
    plain = nn.Linear(4, 1)
    watched = nn.Linear(4, 1)
    watched.load_state_dict(plain.state_dict())
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        init(tmp_path)
        a = nn.parallel.DistributedDataParallel(plain)
        b = nn.parallel.DistributedDataParallel(watched)
        mon.watch_ddp(b)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        for model in (a, b):
            nn.functional.mse_loss(model(x), y).backward()
        for p, q in zip(plain.parameters(), watched.parameters()):
            assert torch.equal(p.grad, q.grad)


def test_watch_ddp_rejects_a_plain_module(mon):
    with pytest.raises(ValueError, match="DistributedDataParallel"):
        mon.watch_ddp(nn.Linear(2, 2))


def test_auto_step_marks_every_optimizer_step(tmp_path):
    from torch.optim.optimizer import _global_optimizer_post_hooks

    before = len(_global_optimizer_post_hooks)
    with installed(tmp_path / "run", auto_step=True, heartbeat_interval_s=3600) as mon:
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        assert header(mon)[wire.H_STEP] == 4
    assert len(_global_optimizer_post_hooks) == before  # removed at close


def test_disabling_restores_the_real_collectives(tmp_path, monkeypatch):
    original = dist.all_reduce
    with installed(tmp_path / "run", max_errors=1, heartbeat_interval_s=3600) as mon:
        init(tmp_path)
        monkeypatch.setattr(mon.recorder.collectives.groups, "add", lambda g: 1 / 0)
        t = torch.ones(2)
        dist.all_reduce(t)  # our bookkeeping fails; the all-reduce itself still happens
        assert torch.equal(t, torch.ones(2))
        assert mon.errors == 1 and header(mon).status == wire.Status.DISABLED
        assert dist.all_reduce is original


@pytest.mark.filterwarnings("ignore:`torch.distributed.:FutureWarning")  # the deprecated names are the point
@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("all_gather_into_tensor", CollOp.ALL_GATHER),
        ("all_gather_single", CollOp.ALL_GATHER),  # FSDP2's in torch 2.13
        ("reduce_scatter_tensor", CollOp.REDUCE_SCATTER),
        ("reduce_scatter_single", CollOp.REDUCE_SCATTER),
    ],
)
def test_tensor_all_gather_and_reduce_scatter_count_once_whatever_name_is_called(mon, name, op):
    """torch 2.13's all_gather_into_tensor calls all_gather_single (patched too):
    one call is one collective, never two."""
    fn = getattr(dist, name, None)
    if fn is None:
        pytest.skip(f"torch {torch.__version__} has no {name}")
    fn(torch.zeros(4), torch.ones(4))
    h = header(mon)
    assert (h[wire.H_COLL_SEQ], h[wire.H_COLL_DONE_SEQ], h[wire.H_COLL_OP]) == (1, 1, op)
    assert h[wire.H_COLL_BYTES] == 16 and mon.errors == 0
