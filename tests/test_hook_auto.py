"""Zero-code mode (``watchdog run``): which processes are ranks, and what an
unmodified loop records, in process on a single-rank gloo group; explicit calls
win and nothing is counted twice."""

from __future__ import annotations

import importlib
import sys

import pytest

from watchdog.hook.zero_code import auto, run_cli

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from watchdog.contracts import slot as wire  # noqa: E402
from watchdog.contracts.slot import CollOp, Phase, RecordKind  # noqa: E402
from watchdog.hook import install  # noqa: E402
from watchdog.hook.testing import ENV_VARS, installed, read_monitor, records_of, step_splits  # noqa: E402

PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    ("env", "argv", "reason"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2"}, [PY, "-u", "train.py"], "torchrun"),
        ({"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, [PY, "train.py"], "slurm"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, [PY, "train.py"], "openmpi"),
        ({auto.ROOT_PID_ENV: "100"}, [PY, "train.py"], "command"),  # plain `watchdog run -- python train.py`
        ({auto.ROOT_PID_ENV: "99"}, [PY, "helper.py"], None),  # a python started by a shell script
        ({}, [PY, "train.py"], None),
        # launchers are never ranks, even inside a Slurm step (srun torchrun)
        ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}, [PY, "/venv/bin/torchrun", "x.py"], None),
        ({auto.ROOT_PID_ENV: "100"}, [PY, "-m", "torch.distributed.run", "x.py"], None),
        ({auto.ROOT_PID_ENV: "100"}, [PY, "-u", "-m", "accelerate.commands.launch", "x.py"], None),
        # a rank's spawned DataLoader worker inherits RANK: it is not the rank
        ({"RANK": "1", "WORLD_SIZE": "2", auto.RANK_PID_ENV: "42"}, [PY, "-c", "spawn_main()"], None),
        ({"RANK": "1", "WORLD_SIZE": "2", auto.RANK_PID_ENV: "100"}, [PY, "train.py"], "torchrun"),
    ],
)
def test_which_processes_are_ranks(env, argv, reason):
    assert auto.rank_reason(env, argv, pid=100) == reason


def test_the_command_runs_with_the_bootstrap_first_on_its_path():
    env = run_cli.command_env({"PYTHONPATH": "/a:/b", auto.RANK_PID_ENV: "7"}, pid=55)
    assert env["PYTHONPATH"].split(":") == [run_cli.BOOTSTRAP_DIR, "/a", "/b"]
    assert env[auto.ROOT_PID_ENV] == "55" and auto.RANK_PID_ENV not in env
    assert (run_cli.Path(run_cli.BOOTSTRAP_DIR) / "sitecustomize.py").is_file()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def mon(tmp_path):
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as m:
        auto.enable(m)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        yield m


def loader():
    return DataLoader(TensorDataset(torch.randn(24, 4), torch.randn(24, 1)), batch_size=8)


def unmodified_loop(model, epochs=1, explicit=None):
    """What a user's loop does; ``explicit``: the monitor, for a script that also calls the API."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = loader()
    for _ in range(epochs):
        for x, y in explicit.wrap_loader(batches) if explicit else batches:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if explicit:
                explicit.step()


def test_an_unmodified_loop_records_steps_data_waits_and_ddps_buckets(mon):
    unmodified_loop(nn.parallel.DistributedDataParallel(nn.Linear(4, 1)), epochs=2)
    splits = step_splits(read_monitor(mon))
    assert [s.step for s in splits] == [1, 2, 3, 4, 5, 6]
    # one fetch per step; the first epoch's ending fetch (StopIteration) goes to step 4
    assert [s.data_waits for s in splits] == [1, 1, 1, 2, 1, 1]
    assert [s.collectives for s in splits] == [1] * 6 and splits[-1].last_coll_seq == 6
    h = read_monitor(mon).header
    assert h[wire.H_COLL_OP] == CollOp.DDP_ALL_REDUCE and h[wire.H_COLL_DONE_SEQ] == 6
    assert mon.errors == 0


def test_explicit_calls_win_and_nothing_is_counted_twice(mon):
    assert install() is mon  # the script's own install() gets the running monitor
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    mon.watch_ddp(model)
    unmodified_loop(model, epochs=2, explicit=mon)
    splits = step_splits(read_monitor(mon))
    assert [s.step for s in splits] == [1, 2, 3, 4, 5, 6]  # optimizer hook and mon.step(): once
    assert [s.data_waits for s in splits] == [1, 1, 1, 2, 1, 1]  # as without watchdog run (above)
    assert [s.collectives for s in splits] == [1] * 6
    assert mon.errors == 0


def test_the_scripts_own_comm_hook_is_kept_and_timed(mon):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    called = []

    def my_hook(state, bucket):
        called.append(1)
        return allreduce_hook(state, bucket)

    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    model.register_comm_hook(None, my_hook)
    unmodified_loop(model)
    assert len(called) == 3
    splits = step_splits(read_monitor(mon))
    assert [s.collectives for s in splits] == [1, 1, 1]
    assert read_monitor(mon).header[wire.H_COLL_OP] == CollOp.DDP_ALL_REDUCE


def test_torch_save_is_a_checkpoint_phase_unless_the_script_marks_its_own(mon, tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    phases = [r.payload[:2] for r in records_of(read_monitor(mon), RecordKind.PHASE)]
    assert phases == [(Phase.CHECKPOINT, Phase.TRAIN), (Phase.TRAIN, Phase.CHECKPOINT)]
    with mon.phase("eval"):  # the script marks phases itself: from now on only its own
        torch.save({"w": torch.ones(2)}, tmp_path / "b.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "c.pt")
    entered = [r.payload[0] for r in records_of(read_monitor(mon), RecordKind.PHASE)]
    assert entered == [Phase.CHECKPOINT, Phase.TRAIN, Phase.EVAL, Phase.TRAIN]
    assert torch.load(tmp_path / "c.pt")["w"].sum() == 2


def test_distributed_checkpoint_save_is_a_checkpoint_phase_once_the_script_imports_it(mon, tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "dcp"))
    phases = [r.payload[0] for r in records_of(read_monitor(mon), RecordKind.PHASE)]
    assert phases[:2] == [Phase.CHECKPOINT, Phase.TRAIN], phases
    assert mon.errors == 0


def test_after_import_runs_once_the_module_has_executed(tmp_path, monkeypatch):
    (tmp_path / "wd_auto_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    auto.after_import("wd_auto_probe", lambda m: seen.append(m.VALUE))
    assert seen == []
    importlib.import_module("wd_auto_probe")  # the module the test wrote: not one mypy can see

    assert seen == [1]
    auto.after_import("wd_auto_probe", lambda m: seen.append(2))  # already imported: at once
    assert seen == [1, 2]
    sys.modules.pop("wd_auto_probe", None)


def test_close_undoes_every_patch(tmp_path):
    from torch.nn.parallel import DistributedDataParallel as DDP

    before = (DataLoader.__iter__, DDP.__init__, DDP.register_comm_hook, torch.save)
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as m:
        auto.enable(m)
        assert DataLoader.__iter__ is not before[0] and torch.save is not before[3]
    assert (DataLoader.__iter__, DDP.__init__, DDP.register_comm_hook, torch.save) == before


def test_the_first_explicit_call_passes_every_argument_through(mon):
    """The one-time wrappers forward what the script passed, keywords included."""
    batches = mon.wrap_loader(loader(), **({"batch_size": 8} if "batch_size" in _params(type(mon).wrap_loader) else {}))
    assert len(list(batches)) == 3
    mon.step(loss=0.5)
    with mon.phase(name="eval"):
        pass
    assert mon.errors == 0 and read_monitor(mon).header[wire.H_STEP] == 1


def _params(fn):
    import inspect

    return inspect.signature(fn).parameters
