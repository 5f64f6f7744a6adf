"""A finer split of compute, opted into per model: forward, backward, optimizer.

    split = mon.watch_model(model, optimizer)   # or ModelSplit().watch(model, optimizer)
    ...
    split.means()   # {"forward_s": ..., "backward_s": ..., "optimizer_s": ..., "steps": n}

Three hooks torch already offers, each one clock read and one add per step:
the model's forward pre/post hooks (root module only, never per layer) and the
optimizer's step pre/post hooks. Backward is the time from the end of the
forward to the start of the optimizer step: loss, backward and DDP's gradient
all-reduce wait together (the collective part is what the slot's collective
time already measures). Host-to-device copies are timed by the loader instead
(``mon.wrap_loader(loader, device=...)``): no model hook sees them.

Through the slot. Given the recorder's ``split`` list (``mon.watch_model`` does
that), every hook also adds its nanoseconds there; the recorder's step writes
them into the step's record and the running totals (wire H_TOTAL_FWD_NS ..),
so the agent exports them and the coordinator shows them.

Off the default path: nothing here runs unless ``watch_model`` is called. Like
the rest of the hook it never raises into training: a failing hook counts an
error and stops timing. Cost: ``benchmarks/model_split_overhead.py``.
"""

from __future__ import annotations

import time
from typing import Any

_FIELDS = ("forward_s", "backward_s", "optimizer_s")


class ModelSplit:
    """Sums of forward, backward and optimizer time (ns, from ``clock``, an int
    nanosecond clock), and optionally the recorder's per-step ``acc``."""

    __slots__ = ("_acc", "_clock", "_handles", "_sums", "_t_fwd", "_t_fwd_end", "_t_opt", "errors", "steps")

    def __init__(self, clock: Any = time.monotonic_ns, acc: list[int] | None = None) -> None:
        self._clock = clock
        self._acc = acc if acc is not None else [0, 0, 0, 0]  # the step's forward, backward, optimizer (h2d)
        self._t_fwd = 0
        self._t_fwd_end = 0
        self._t_opt = 0
        self._sums = [0, 0, 0]
        self.steps = 0
        self.errors = 0
        self._handles: list[Any] = []

    def watch(self, model: Any, optimizer: Any) -> ModelSplit:
        """Misuse fails here, loudly (install time), never later."""
        inner = getattr(model, "module", model)  # DDP: time the wrapped module's forward
        if not callable(getattr(inner, "register_forward_pre_hook", None)):
            raise ValueError(f"watch_model: expected a torch.nn.Module, got {type(model).__name__}")
        if not callable(getattr(optimizer, "register_step_pre_hook", None)):
            raise ValueError(f"watch_model: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self._handles = [
            inner.register_forward_pre_hook(self._fwd_pre),
            inner.register_forward_hook(self._fwd_post),
            optimizer.register_step_pre_hook(self._opt_pre),
            optimizer.register_step_post_hook(self._opt_post),
        ]
        return self

    # The hooks: a clock read and an add each; any error stops timing, never training.
    def _fwd_pre(self, *_: Any) -> None:
        try:
            self._t_fwd = self._clock()
        except Exception:
            self._fail()

    def _fwd_post(self, *_: Any) -> None:
        try:
            self._t_fwd_end = now = self._clock()
            d = now - self._t_fwd
            self._sums[0] += d
            self._acc[0] += d
        except Exception:
            self._fail()

    def _opt_pre(self, *_: Any) -> None:
        try:
            self._t_opt = now = self._clock()
            if self._t_fwd_end:
                d = now - self._t_fwd_end
                self._sums[1] += d
                self._acc[1] += d
        except Exception:
            self._fail()

    def _opt_post(self, *_: Any) -> None:
        try:
            d = self._clock() - self._t_opt
            self._sums[2] += d
            self._acc[2] += d
            self.steps += 1
            self._t_fwd_end = 0  # a second optimizer step without a forward adds no backward
        except Exception:
            self._fail()

    def _fail(self) -> None:
        self.errors += 1
        self.close()

    def means(self) -> dict[str, float]:
        n = max(1, self.steps)
        out: dict[str, float] = {k: v / n / 1e9 for k, v in zip(_FIELDS, self._sums)}
        out["steps"] = self.steps
        return out

    def close(self) -> None:
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles = []
