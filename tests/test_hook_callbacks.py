"""The Lightning and Hugging Face callbacks: the rules they share
(``CallbackMarks``, time as a number), and each one driven by its library's
real Trainer in process (one rank, CPU): steps per optimizer step, eval and
checkpoint phases, a requested checkpoint that is a real, loadable one, and,
under zero-code mode, nothing counted twice."""

from __future__ import annotations

import subprocess
import sys

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Command, Phase, RecordKind
from watchdog.hook.marks.callback_marks import CallbackMarks
from watchdog.hook.testing import ENV_VARS, FakeClock, installed, read_monitor, records_of, step_splits
from watchdog.hook.zero_code import auto

MS = 1_000_000


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def mon(tmp_path, clock):
    with installed(tmp_path / "run", clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as m:
        yield m


def phases(mon):
    return [r.payload[0] for r in records_of(read_monitor(mon), RecordKind.PHASE)]


def test_the_hook_and_the_callback_modules_import_without_either_library():
    code = (
        "import sys\n"
        "sys.modules['lightning'] = sys.modules['transformers'] = None  # not installed\n"
        "import watchdog.hook, watchdog.hook.lightning as L, watchdog.hook.hf as H\n"
        "for m in (L, H):\n"
        "    try:\n"
        "        m.WatchdogCallback\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "watchdog.hook.lightning.WatchdogCallback needs Lightning: pip install 'rank-watchdog[lightning]'",
        "watchdog.hook.hf.WatchdogCallback needs Transformers: pip install 'rank-watchdog[hf]'",
    ]
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, watchdog.hook; print(sorted({'lightning', 'transformers'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]", out


def test_the_gap_between_batches_is_a_data_wait_unless_validation_or_a_save_fills_it(mon, clock):
    marks = CallbackMarks(mon)
    marks.resume()  # epoch start
    clock.advance(3 * MS)  # first fetch
    marks.batch_start()
    clock.advance(10 * MS)
    marks.batch_end(stepped=False)  # gradient accumulation: not a step
    clock.advance(2 * MS)
    marks.batch_start()
    clock.advance(10 * MS)
    marks.batch_end(stepped=True)  # step 1: two fetches, 5 ms
    assert read_monitor(mon).header.in_data_wait  # a live reader sees "waiting on data"
    clock.advance(1 * MS)
    marks.enter(Phase.EVAL)  # validation fills the gap: not data
    assert not read_monitor(mon).header.in_data_wait
    clock.advance(50 * MS)
    marks.leave()
    clock.advance(4 * MS)  # the fetch after validation is data again
    marks.batch_start()
    clock.advance(10 * MS)
    marks.batch_end(stepped=True)
    marks.stop()
    (s1, s2) = step_splits(read_monitor(mon))
    assert (s1.data_ns, s1.data_waits, s1.step_ns) == (5 * MS, 2, 25 * MS)
    assert (s2.data_ns, s2.data_waits) == (4 * MS, 1)
    assert phases(mon) == [Phase.EVAL, Phase.TRAIN]
    assert not read_monitor(mon).header.in_data_wait and mon.errors == 0


def test_hand_over_switches_the_automatic_sources_off_before_the_first_mark(mon, tmp_path):
    torch = pytest.importorskip("torch")
    auto.enable(mon)
    auto.hand_over(mon, "step", "data", "save")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    for _ in torch.utils.data.DataLoader(list(range(3)), batch_size=1):  # no longer timed
        opt.step()  # no longer a step
    torch.save({}, tmp_path / "x.pt")  # no longer a phase
    assert read_monitor(mon).header[wire.H_STEP] == 0 and phases(mon) == []
    mon.step()  # the callback's first step is counted: nothing to absorb
    assert [s.data_waits for s in step_splits(read_monitor(mon))] == [0]
    auto.hand_over(mon, "step")  # twice: nothing left to do
    assert mon.errors == 0


def test_under_zero_code_a_scripts_own_data_wait_marks_switch_the_loader_patch_off(mon):
    torch = pytest.importorskip("torch")
    auto.enable(mon)
    mon.data_wait_begin()  # the script marks its own waits: the DataLoader is no longer timed
    mon.data_wait_end()
    for _ in torch.utils.data.DataLoader(list(range(3)), batch_size=1):
        pass
    mon.step()
    assert [s.data_waits for s in step_splits(read_monitor(mon))] == [1]


# -- Lightning, its real Trainer -------------------------------------------------------------


def _lightning_trainer(tmp_path, callbacks, **kw):
    L = pytest.importorskip("lightning")
    settings = {"enable_checkpointing": False, **kw}
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "lightning"),
        callbacks=callbacks,
        **settings,
    )


def _lightning_model():
    pytest.importorskip("lightning")
    import lightning as L
    import torch
    from torch import nn

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Model()


def _loader(n=12):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.randn(n, 4), torch.randn(n, 1)), batch_size=2)


def test_lightning_steps_per_optimizer_step_validation_is_eval_and_saves_are_checkpoints(mon, tmp_path):
    pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from watchdog.hook.lightning import WatchdogCallback

    saves = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, save_top_k=-1)
    trainer = _lightning_trainer(
        tmp_path, [WatchdogCallback(monitor=mon), saves], max_steps=3, accumulate_grad_batches=2,
        val_check_interval=4, num_sanity_val_steps=0, enable_checkpointing=True,
    )  # fmt: skip
    trainer.fit(_lightning_model(), _loader(), _loader(4))
    splits = step_splits(read_monitor(mon))
    assert [s.step for s in splits] == [1, 2, 3] and trainer.global_step == 3  # 6 batches, 2 per step
    assert [s.data_waits for s in splits] == [2, 2, 2]  # every fetch of the step's two batches
    # validation after 4 batches (step 2), ModelCheckpoint's save at step 3
    assert phases(mon) == [Phase.EVAL, Phase.TRAIN, Phase.CHECKPOINT, Phase.TRAIN]
    assert len(list((tmp_path / "ckpt").glob("*.ckpt"))) == 1
    assert not read_monitor(mon).header.in_data_wait and mon.errors == 0
    assert "save_checkpoint" not in trainer.__dict__  # teardown put the Trainer's own method back


def test_lightning_a_requested_checkpoint_is_a_real_one_acked_after_the_save(mon, tmp_path):
    pytest.importorskip("lightning")
    import torch

    from watchdog.hook.lightning import WatchdogCallback
    from watchdog.hook.slot import control_block as control

    seen = []
    cb = WatchdogCallback(monitor=mon)
    trainer = _lightning_trainer(tmp_path, [cb], max_steps=5, limit_val_batches=0)
    orig_fit_start = cb.on_fit_start

    def request(trainer, pl_module):  # the agent's request, before training starts
        orig_fit_start(trainer, pl_module)
        wire.write_control(mon.slot_path, 1, Command.CHECKPOINT_AT_STEP, 2)
        mon.control.poll()

    cb.on_fit_start = request
    plain = type(trainer).save_checkpoint

    def spy(self, path, *a, **kw):
        seen.append((read_monitor(mon).header[wire.H_CTRL_ACK_SEQ], read_monitor(mon).header[wire.H_PHASE]))
        return plain(self, path, *a, **kw)

    type(trainer).save_checkpoint = spy
    try:
        trainer.fit(_lightning_model(), _loader())
    finally:
        type(trainer).save_checkpoint = plain
    path = tmp_path / "lightning" / "checkpoints" / "watchdog-step=2.ckpt"
    assert seen == [(0, Phase.CHECKPOINT)]  # saved inside the phase, not acked yet
    h = read_monitor(mon).header
    assert (h[wire.H_CTRL_ACK_SEQ], h[wire.H_CTRL_ACK_RESULT], h[wire.H_CTRL_ACK_STEP]) == (1, control.ACK_OK, 2)
    assert torch.load(path, weights_only=False)["global_step"] == 2  # Lightning's own checkpoint


def test_lightning_under_zero_code_counts_each_step_and_wait_once(mon, tmp_path):
    pytest.importorskip("lightning")
    from watchdog.hook.lightning import WatchdogCallback

    auto.enable(mon)
    trainer = _lightning_trainer(tmp_path, [WatchdogCallback(monitor=mon)], max_steps=4, limit_val_batches=0)
    trainer.fit(_lightning_model(), _loader())
    splits = step_splits(read_monitor(mon))
    assert [(s.step, s.data_waits) for s in splits] == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert mon.errors == 0


# -- Hugging Face, its real Trainer -------------------------------------------------------------


def _hf_trainer(tmp_path, mon, n=16, **kw):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(n)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        use_cpu=True,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **kw,
    )
    return transformers.Trainer(model=Model(), args=args, train_dataset=data, eval_dataset=data[:4])


def test_hf_steps_per_optimizer_step_evaluation_is_eval_and_saves_are_checkpoints(mon, tmp_path):
    trainer = _hf_trainer(
        tmp_path, mon, max_steps=4, gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2,
        save_strategy="steps", save_steps=4,
    )  # fmt: skip
    from watchdog.hook.hf import watch

    watch(trainer, monitor=mon)
    with pytest.raises(ValueError, match="already has"):
        watch(trainer, monitor=mon)
    trainer.train()
    splits = step_splits(read_monitor(mon))
    assert [s.step for s in splits] == [1, 2, 3, 4]
    assert [s.data_waits for s in splits] == [1, 1, 1, 1]  # one gap per step: the window's two batches
    # evaluation after steps 2 and 4, the save after step 4's evaluation
    assert phases(mon) == [Phase.EVAL, Phase.TRAIN, Phase.EVAL, Phase.TRAIN, Phase.CHECKPOINT, Phase.TRAIN]
    assert (tmp_path / "hf" / "checkpoint-4").is_dir()
    assert not read_monitor(mon).header.in_data_wait and mon.errors == 0


def test_hf_a_requested_checkpoint_is_the_trainers_own_and_acked_after_it(mon, tmp_path):
    from transformers import TrainerCallback

    from watchdog.hook.hf import watch
    from watchdog.hook.slot import control_block as control

    trainer = _hf_trainer(tmp_path, mon, max_steps=4, save_strategy="no")

    class Request(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            wire.write_control(mon.slot_path, 1, Command.CHECKPOINT_AT_STEP, 3)
            mon.control.poll()

    trainer.add_callback(Request())
    watch(trainer, monitor=mon)
    trainer.train()
    h = read_monitor(mon).header
    assert (h[wire.H_CTRL_ACK_SEQ], h[wire.H_CTRL_ACK_RESULT], h[wire.H_CTRL_ACK_STEP]) == (1, control.ACK_OK, 3)
    ckpt = tmp_path / "hf" / "checkpoint-3"
    assert (ckpt / "trainer_state.json").is_file() and (ckpt / "optimizer.pt").is_file()
    assert phases(mon) == [Phase.CHECKPOINT, Phase.TRAIN]


def test_hf_under_zero_code_counts_each_step_and_wait_once(mon, tmp_path):
    trainer = _hf_trainer(tmp_path, mon, max_steps=3, save_strategy="no")
    auto.enable(mon)
    from watchdog.hook.hf import watch

    watch(trainer, monitor=mon)
    trainer.train()
    assert [(s.step, s.data_waits) for s in step_splits(read_monitor(mon))] == [(1, 1), (2, 1), (3, 1)]
    assert mon.errors == 0


def test_under_zero_code_a_constructed_trainer_gets_the_callback_once(mon, tmp_path):
    """``watchdog run``: the Trainer gets the callback when constructed; a script
    that also adds its own (or calls watch) still has one callback."""
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from transformers import Trainer

    from watchdog.hook import hf, lightning

    auto.enable(mon)
    trainer = _hf_trainer(tmp_path, mon, max_steps=4, eval_strategy="steps", eval_steps=2, save_strategy="no")
    (cb,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, hf.HfMarks)]
    assert cb.automatic and cb.trainer is trainer and hf.watch(trainer) is cb
    trainer.train()
    assert [s.step for s in step_splits(read_monitor(mon))] == [1, 2, 3, 4]
    assert phases(mon) == [Phase.EVAL, Phase.TRAIN, Phase.EVAL, Phase.TRAIN]
    own = hf.WatchdogCallback(monitor=mon)
    again = Trainer(model=trainer.model, args=trainer.args, eval_dataset=[], callbacks=[own])
    assert [c for c in again.callback_handler.callbacks if isinstance(c, hf.HfMarks)] == [own]
    assert own.trainer is again  # the script's callback learnt its trainer: checkpoints work

    first = _lightning_trainer(tmp_path, [])
    assert isinstance(first.callbacks[0], lightning.LightningMarks)
    own = lightning.WatchdogCallback(monitor=mon)
    second = _lightning_trainer(tmp_path, [own])
    assert [c for c in second.callbacks if isinstance(c, lightning.LightningMarks)] == [own]
    assert mon.errors == 0


def test_under_zero_code_the_trainer_still_takes_its_settings_from_the_environment(mon, tmp_path, monkeypatch):
    """Lightning fills the arguments a script leaves out from PL_TRAINER_* by reading
    the Trainer's signature: the patched constructor must keep it, or a script run
    with ``PL_TRAINER_DEVICES=2 PL_TRAINER_STRATEGY=ddp`` trains as one process per rank."""
    import inspect

    L = pytest.importorskip("lightning")
    plain = inspect.signature(L.Trainer)
    auto.enable(mon)
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_LIMIT_VAL_BATCHES", "3")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert getattr(L.Trainer.__init__, "watchdog_trainer", False)  # the patched constructor ran
    assert inspect.signature(L.Trainer) == plain
    assert (trainer.max_steps, trainer.limit_val_batches) == (7, 3)
    assert mon.errors == 0


def test_a_resumed_run_counts_in_the_jobs_own_steps(tmp_path, clock):
    pytest.importorskip("lightning")
    from watchdog.hook.hf import watch
    from watchdog.hook.lightning import WatchdogCallback

    def steps(mon):
        return [s.step for s in step_splits(read_monitor(mon))]

    ckpt = tmp_path / "l.ckpt"
    with installed(tmp_path / "a", clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        trainer = _lightning_trainer(tmp_path, [WatchdogCallback(monitor=mon)], max_steps=3, limit_val_batches=0)
        trainer.fit(_lightning_model(), _loader())
        trainer.save_checkpoint(str(ckpt))
    with installed(tmp_path / "b", clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        trainer = _lightning_trainer(tmp_path, [WatchdogCallback(monitor=mon)], max_steps=5, limit_val_batches=0)
        trainer.fit(_lightning_model(), _loader(), ckpt_path=str(ckpt))
        assert steps(mon) == [4, 5]
    with installed(tmp_path / "c", clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        trainer = _hf_trainer(tmp_path, mon, max_steps=2, save_strategy="steps", save_steps=2)
        watch(trainer, monitor=mon)
        trainer.train()
    with installed(tmp_path / "d", clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        trainer = _hf_trainer(tmp_path, mon, max_steps=4, save_strategy="no")
        watch(trainer, monitor=mon)
        trainer.train(resume_from_checkpoint=True)
        assert steps(mon) == [3, 4]


def test_a_callback_that_fails_or_a_disabled_monitor_never_stops_training(mon, tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    from watchdog.hook import NullMonitor
    from watchdog.hook.lightning import WatchdogCallback

    def broken(self, stepped):
        raise RuntimeError("a framework attribute moved")

    monkeypatch.setattr(CallbackMarks, "batch_end", broken)
    trainer = _lightning_trainer(tmp_path, [WatchdogCallback(monitor=mon)], max_steps=3, limit_val_batches=0)
    trainer.fit(_lightning_model(), _loader())
    assert trainer.global_step == 3 and mon.errors == 3  # counted by the monitor, not raised
    monkeypatch.undo()
    trainer = _lightning_trainer(tmp_path, [WatchdogCallback(monitor=NullMonitor())], max_steps=3)
    trainer.fit(_lightning_model(), _loader(), _loader(4))
    assert trainer.global_step == 3


def test_lightning_a_sigtermed_rank_exits_as_one_under_torchelastic(mon, monkeypatch):
    """Lightning ends a SIGTERMed rank with status 0, which torchrun reads as
    "finished" (no restart ever follows: tests/test_e2e_callbacks.py)."""
    pytest.importorskip("lightning")
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from watchdog.hook.lightning import WatchdogCallback

    cb = WatchdogCallback(monitor=mon)
    exc = SIGTERMException()
    cb.on_exception(None, None, exc)
    assert exc.code is None  # not under torchelastic: Lightning's own status
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    cb.on_exception(None, None, exc)
    assert exc.code == 143
    other = SystemExit(0)
    cb.on_exception(None, None, other)
    assert other.code == 0  # only Lightning's SIGTERM exit
    exc = SIGTERMException()
    WatchdogCallback(monitor=mon, sigterm_exit_code=None).on_exception(None, None, exc)
    assert exc.code is None and mon.errors == 0
