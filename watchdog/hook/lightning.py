"""PyTorch Lightning: ``WatchdogCallback``, the explicit API in one callback.

    from watchdog.hook.lightning import WatchdogCallback
    trainer = L.Trainer(..., callbacks=[WatchdogCallback()])

What it marks (``watchdog.hook.marks.callback_marks`` holds the shared rules):

  steps        when ``trainer.global_step`` advances at a batch's end: one per
               optimizer step, so gradient accumulation counts k batches as one
  data waits   a batch's end -> the next batch's start (validation and
               checkpoints in that gap are not counted)
  collectives  DDP's gradient buckets (``watch_ddp`` on the strategy's model when
               it is DistributedDataParallel), and torch.distributed's functions
  phases       validation (and test / predict) as ``eval``; every
               ``trainer.save_checkpoint`` (ModelCheckpoint's too) as ``checkpoint``
  checkpoint   registered with the monitor: the coordinator's
               ``checkpoint_restart`` saves a real Lightning checkpoint
               (``trainer.save_checkpoint``, resumable with ``fit(ckpt_path=...)``)
               and is acked only once the save returned on this rank

A SIGTERMed rank under torchelastic exits with status 143 instead of Lightning's
0 (``sigterm_exit_code``): with 0, torchrun reads the group as finished and a
restart (torchrun's own, or the coordinator's ``restart`` and
``checkpoint_restart``, which SIGTERM the workers) never happens.

The monitor is installed when the callback is constructed (before the Trainer
initialises the process group, so the hook sees the group join and makes it
restart-safe under torchrun). Under ``watchdog run`` it takes over the automatic
step, data and save sources: nothing is counted twice.

This module imports without Lightning installed; ``WatchdogCallback`` is built
on first use (a module ``__getattr__``), as a subclass of
``lightning.pytorch.Callback`` (the ``lightning`` package; a Trainer from the
older ``pytorch_lightning`` package does not accept it).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from watchdog.contracts.slot import Phase
from watchdog.hook.marks.callback_marks import CallbackMarks, guarded, lazy_callback

log = logging.getLogger("watchdog.hook")

__all__ = ["WatchdogCallback"]

WatchdogCallback: type  # built on first use: module __getattr__ below

CHECKPOINT_NAME = "watchdog-step={step}.ckpt"


def default_checkpoint_path(trainer: Any, step: int) -> str:
    """Where a requested checkpoint goes: the Trainer's ``default_root_dir``/checkpoints."""
    return os.path.join(trainer.default_root_dir, "checkpoints", CHECKPOINT_NAME.format(step=step))


class LightningMarks:
    """The callback's behaviour, without Lightning's base class (tests drive it
    with the real Trainer through ``WatchdogCallback``)."""

    def __init__(
        self,
        monitor: Any = None,
        checkpoint_path: Callable[[Any, int], str] | None = None,
        sigterm_exit_code: int | None = 128 + signal.SIGTERM,
    ) -> None:
        if monitor is None:
            from watchdog.hook import install

            monitor = install()
        if checkpoint_path is not None and not callable(checkpoint_path):
            raise ValueError(f"WatchdogCallback(checkpoint_path=...): {checkpoint_path!r} is not callable")
        monitor.hand_over("step", "data", "save")  # under `watchdog run`: the callback marks these itself
        self.marks = CallbackMarks(monitor)
        self.checkpoint_path = checkpoint_path or default_checkpoint_path
        self.sigterm_exit_code = sigterm_exit_code
        self._last_step = -1
        self._trainer: Any = None
        self._plain_save: Any = None
        self._watched: set[int] = set()

    # -- attach / detach ----------------------------------------------------------

    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._trainer is trainer:
            return
        self._trainer = trainer
        mon = self.marks.mon
        plain = trainer.save_checkpoint
        marks = self.marks

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:  # instance level: this trainer only
            marks.enter(Phase.CHECKPOINT)
            try:
                return plain(*args, **kwargs)
            finally:
                marks.leave()

        trainer.save_checkpoint = save_checkpoint
        self._plain_save = plain
        mon.register_checkpoint(lambda step: trainer.save_checkpoint(self.checkpoint_path(trainer, step)))

    @guarded
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.marks.stop()
        if self._plain_save is not None and trainer is self._trainer:
            trainer.__dict__.pop("save_checkpoint", None)  # the class's method again
            self._plain_save = None
            self._trainer = None

    @guarded
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        model = getattr(trainer.strategy, "model", None)
        if isinstance(model, DistributedDataParallel) and id(model) not in self._watched:
            self._watched.add(id(model))
            self.marks.mon.watch_ddp(model)

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # after a resume (fit(ckpt_path=...)) the slot counts in the job's own steps
        step = trainer.global_step
        if step > 0:
            self.marks.mon.set_step(step)
        self._last_step = step

    # -- training -------------------------------------------------------------------

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.marks.resume()  # the epoch's first fetch is a data wait too

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.marks.batch_start()

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        stepped = step > self._last_step
        self._last_step = step
        self.marks.batch_end(stepped)

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.marks.stop()

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.marks.stop()
        # Lightning ends a SIGTERMed rank with SIGTERMException, a SystemExit whose
        # status is 0: torchelastic then reads the group as finished, and neither its
        # own restarts nor the coordinator's restart actions (which SIGTERM the
        # workers) can bring it back. Under torchelastic, exit as a SIGTERMed process does.
        if (
            self.sigterm_exit_code is not None
            and type(exception).__name__ == "SIGTERMException"
            and isinstance(exception, SystemExit)
            and exception.code in (None, 0)
            and os.environ.get("TORCHELASTIC_RUN_ID")
        ):
            exception.code = self.sigterm_exit_code
            log.warning(
                "watchdog.hook lightning: SIGTERM: exiting with status %d (torchelastic may restart)", exception.code
            )
        if isinstance(exception, SystemExit):
            # Raised, never through sys.exit, and past the excepthook: the rank's end is
            # said here. A SIGTERM is a failure even where Lightning exits with status 0.
            from watchdog.hook.lifecycle import installer as lifecycle

            lifecycle.note_system_exit(exception, failed=type(exception).__name__ == "SIGTERMException")

    # -- evaluation -------------------------------------------------------------------

    @guarded
    def _eval_start(self, trainer: Any, pl_module: Any) -> None:
        self.marks.enter(Phase.EVAL)

    @guarded
    def _eval_end(self, trainer: Any, pl_module: Any) -> None:
        self.marks.leave()

    on_validation_start = on_test_start = on_predict_start = _eval_start
    on_validation_end = on_test_end = on_predict_end = _eval_end


_callback_class, __getattr__ = lazy_callback(
    __name__,
    LightningMarks,
    ("lightning.pytorch", "Callback"),
    "Lightning",
    "lightning",
    """rank-watchdog's Lightning callback (see ``watchdog.hook.lightning``).
    ``monitor``: the monitor to mark (default: ``watchdog.hook.install()``);
    ``checkpoint_path(trainer, step)``: where a requested checkpoint goes;
    ``sigterm_exit_code``: a SIGTERMed rank's exit status under torchelastic
    (Lightning's own is 0, which reads as "finished"; None keeps it).""",
)
