"""The monitor that does nothing, at no cost.

Returned by ``install()`` when the hook is disabled, and what a live Monitor turns
into after close(), after repeated internal errors, or in a forked child: the
decision is made once, so the training loop never pays for an ``if enabled``.
Same API as Monitor; context managers are shared singletons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from typing import Any, TypeVar

T = TypeVar("T")

NULL_CONTEXT = nullcontext()  # reusable and reentrant


def nop(*args: Any, **kwargs: Any) -> None:
    return None


class NullMonitor:
    enabled = False
    slot_path: str | None = None
    config = None

    @property
    def errors(self) -> int:
        return 0

    def step(self, loss: float | None = None) -> None:
        pass

    def step_scope(self) -> nullcontext:
        return NULL_CONTEXT

    def wrap_loader(
        self, iterable: Iterable[T], *, device: Any = None, non_blocking: bool = False, batch_size: int = 0
    ) -> Iterable[T]:
        if device is None:
            return iterable
        from watchdog.hook.marks.loader import to_device  # the batches must still reach the device

        return (to_device(b, device, non_blocking) for b in iterable)

    def set_batch_size(self, samples: int) -> None:
        pass

    def data_wait_begin(self) -> None:
        pass

    def data_wait_end(self, counted: bool = True) -> None:
        pass

    def phase(self, name: Any) -> nullcontext:
        return NULL_CONTEXT

    def collective(self, op: Any, group: Any = None, nbytes: int = 0) -> nullcontext:
        return NULL_CONTEXT

    def watch_ddp(self, model: Any, *, hook: Callable | None = None, state: Any = None) -> None:
        pass

    def watch_model(self, model: Any, optimizer: Any) -> Any:
        from watchdog.hook.marks.model_split import ModelSplit

        return ModelSplit()  # never attached: reads zeros

    def register_checkpoint(self, fn: Callable[[int], Any]) -> None:
        pass

    def set_step(self, step: int) -> None:
        pass

    def hand_over(self, *sources: str) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "NullMonitor()"


NULL_MONITOR = NullMonitor()
