"""Hugging Face Transformers: ``watch(trainer)`` and ``WatchdogCallback``.

    from watchdog.hook.hf import watch
    trainer = Trainer(model=..., args=..., train_dataset=...)
    watch(trainer)          # adds the callback, with the trainer it needs
    trainer.train()

What it marks (``watchdog.hook.marks.callback_marks`` holds the shared rules):

  steps        ``on_step_end``: once per optimizer step (gradient accumulation's
               micro-batches end in ``on_substep_end`` and are not steps)
  data waits   ``on_step_end`` -> the next ``on_step_begin`` (the Trainer fetches
               the accumulation window's batches in that gap)
  phases       ``eval`` from the step whose ``control.should_evaluate`` is set
               (the DefaultFlowCallback runs before any callback added later) to
               ``on_evaluate``; ``checkpoint`` from ``should_save`` to ``on_save``.
               An ``evaluate()`` called outside training is ``eval`` from its
               first prediction step. With ``save_strategy="best"`` the Trainer
               decides to save after on_evaluate: that save is not marked.
  collectives  DDP's gradient buckets (``watch_ddp`` on ``trainer.model_wrapped``
               once the Trainer has wrapped it), torch.distributed's functions
  checkpoint   with ``watch(trainer)``: registered with the monitor, so the
               coordinator's ``checkpoint_restart`` writes a real Trainer
               checkpoint (``output_dir/checkpoint-<step>``: model, optimizer,
               scheduler, RNG, trainer state; ``train(resume_from_checkpoint=True)``
               resumes from it), acked once the save returned on this rank

The callback alone (``Trainer(callbacks=[WatchdogCallback()])``) gets no
trainer from Transformers: it marks steps, waits and phases, but watches no DDP
model (``watchdog run`` does that) and registers no checkpoint function.

The monitor is installed when the callback is constructed; under ``watchdog
run`` it takes over the automatic step, data and save sources (nothing counted
twice). This module imports without Transformers; ``WatchdogCallback`` is built
on first use, as a subclass of ``transformers.TrainerCallback``.
"""

from __future__ import annotations

from typing import Any

from watchdog.contracts.slot import Phase
from watchdog.hook.marks.callback_marks import CallbackMarks, guarded, lazy_callback

__all__ = ["WatchdogCallback", "watch"]

WatchdogCallback: type  # built on first use: module __getattr__ below


class HfMarks:
    """The callback's behaviour, without Transformers' base class."""

    automatic = False  # added by `watchdog run` (watchdog.hook.zero_code.auto), not by the script

    def __init__(self, monitor: Any = None, trainer: Any = None) -> None:
        if monitor is None:
            from watchdog.hook import install

            monitor = install()
        monitor.hand_over("step", "data", "save")  # under `watchdog run`: the callback marks these itself
        self.marks = CallbackMarks(monitor)
        self._eval = False  # our eval phase is open
        self._ckpt = False  # our checkpoint phase is open
        self._watched: set[int] = set()
        self.trainer: Any = None
        self.know(trainer)

    def know(self, trainer: Any) -> None:
        """The trainer this callback serves: its DDP model is watched, and requested
        checkpoints are its own. A callback added without one learns it here."""
        if trainer is not None and self.trainer is None:
            self.trainer = trainer
            self.marks.mon.register_checkpoint(self._save)

    def _save(self, step: int) -> None:
        """A real Trainer checkpoint (what save_strategy writes), on every rank:
        the Trainer's save synchronises the ranks itself."""
        trainer = self.trainer
        trainer._save_checkpoint(trainer.model_wrapped, trial=None)  # noqa: SLF001 - the save save_strategy runs

    # -- training ---------------------------------------------------------------------

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mon = self.marks.mon
        if state.global_step > 0:  # resumed: the slot counts in the job's own steps
            mon.set_step(int(state.global_step))
        model = getattr(self.trainer, "model_wrapped", None)
        if model is not None:
            from torch.nn.parallel import DistributedDataParallel

            if isinstance(model, DistributedDataParallel) and id(model) not in self._watched:
                self._watched.add(id(model))  # a second train() on the same model: hooked already
                mon.watch_ddp(model)

    @guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.resume()  # the epoch's first fetch is a data wait too

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.marks.phases:  # a phase whose end event never came (a save_strategy "best" decided no)
            self._close()
        self.marks.batch_start()

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.batch_end(True)
        self._after(control)

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._after(control)

    def _after(self, control: Any) -> None:
        """What the Trainer does next, as the DefaultFlowCallback decided it."""
        if control.should_evaluate and not self._eval:
            self._eval = True
            self.marks.enter(Phase.EVAL)
        elif control.should_save and not self._ckpt:
            self._ckpt = True
            self.marks.enter(Phase.CHECKPOINT)

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.marks.between and not self.marks.phases:
            self.marks.resume()  # the loss gather before the log is a collective, not data

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def _close(self) -> None:
        self._eval = self._ckpt = False
        self.marks.stop()

    # -- evaluation and saves -------------------------------------------------------------

    @guarded
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._eval:  # evaluate() called outside the training loop
            self._eval = True
            self.marks.enter(Phase.EVAL)

    @guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._eval:
            self._eval = False
            self.marks.leave()
        if control.should_save and not self._ckpt:
            self._ckpt = True
            self.marks.enter(Phase.CHECKPOINT)

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._ckpt:
            self._ckpt = False
            self.marks.leave()


_callback_class, __getattr__ = lazy_callback(
    __name__,
    HfMarks,
    ("transformers", "TrainerCallback"),
    "Transformers",
    "hf",
    """rank-watchdog's Trainer callback (see ``watchdog.hook.hf``).
    ``monitor``: the monitor to mark (default: ``watchdog.hook.install()``);
    ``trainer``: lets it watch DDP and save requested checkpoints (``watch``).""",
)


def watch(trainer: Any, monitor: Any = None, *, automatic: bool = False) -> Any:
    """Add a ``WatchdogCallback`` that knows ``trainer`` (DDP watched, requested
    checkpoints saved as the Trainer's own); returns the callback. Call it once,
    before ``train()``. Under ``watchdog run`` the Trainer already has one
    (``automatic``, added when it was constructed): that one is returned."""
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
        if isinstance(cb, HfMarks):
            if cb.automatic or automatic:  # one of the two is `watchdog run`'s: one callback
                cb.know(trainer)
                return cb
            raise ValueError(f"watch(trainer): the trainer already has {cb!r}")
    callback = _callback_class()(monitor=monitor, trainer=trainer)
    callback.automatic = automatic
    trainer.add_callback(callback)
    return callback
