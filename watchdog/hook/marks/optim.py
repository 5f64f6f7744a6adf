"""Automatic step marks: one step per ``optimizer.step()`` of any optimizer.

Uses torch's global optimizer post-hook, so it needs no reference to the user's
optimizer. A loop that steps several optimizers per iteration (GANs) gets several
marks per iteration: call ``mon.step()`` yourself there instead.
"""

from __future__ import annotations

from typing import Any


def register(mon: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def watchdog_step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        mon.step()  # looked up per call: a quiet monitor's step is a no-op

    handle = register_optimizer_step_post_hook(watchdog_step_hook)
    mon.add_undo(handle.remove)
