"""Timing DDP's gradient all-reduce through a comm hook.

DDP's reducer calls its process group from C++, out of reach of the patched
Python collectives. A comm hook is the supported way in: ours marks enter, runs
the real hook (torch's ``allreduce_hook`` unless the user gives theirs), and
marks exit in a ``then`` callback when the bucket's future completes (on the
backend's thread; the slot writer's lock covers that).

torch's ``allreduce_hook`` itself calls ``dist.all_reduce``, which install() may
have patched: while the inner hook runs, this thread is marked so the patched
wrapper passes straight through and the bucket is counted once, as
DDP_ALL_REDUCE. Each bucket is one collective with its own sequence number on
DDP's process group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from watchdog.contracts.slot import CollOp

_OP = int(CollOp.DDP_ALL_REDUCE)


def register(marks: Any, model: Any, *, hook: Callable | None = None, state: Any = None) -> None:
    """Wrap ``hook`` so that each bucket is a collective on ``marks`` (the recorder's CollectiveMarks)."""
    if not callable(getattr(model, "register_comm_hook", None)):
        raise ValueError(
            f"watch_ddp: expected a torch.nn.parallel.DistributedDataParallel model, got {type(model).__name__}"
        )
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as hook
    elif not callable(hook):
        raise ValueError(f"watch_ddp: hook {hook!r} is not callable")
    group = getattr(model, "process_group", None)
    if state is None:
        state = group
    inner: Callable = hook  # type: ignore[assignment]  # torch's allreduce_hook when None (above)
    get_ident = threading.get_ident

    # No annotations: DDP inspects the hook's signature and accepts only an empty
    # or a dist.GradBucket annotation on a parameter named "bucket".
    def watchdog_comm_hook(st, bucket):  # type: ignore[no-untyped-def]
        try:
            nbytes = bucket.buffer().nbytes
        except Exception:
            nbytes = 0
        token = marks.enter(_OP, group, nbytes)
        if token is None:  # marks quiet (monitor closed/disabled) or its bookkeeping failed
            return inner(st, bucket)
        prev = marks.suppress_tid
        marks.suppress_tid = get_ident()
        try:
            fut = inner(st, bucket)
        except BaseException:
            marks.exit_failed(token)
            raise
        finally:
            marks.suppress_tid = prev

        def done(f: Any) -> Any:
            try:
                value = f.value()
            except BaseException:  # re-raised into DDP, as without us; the rank failed inside the bucket
                marks.exit_failed(token)
                raise
            marks.exit(token)
            return value

        try:
            return fut.then(done)
        except Exception as exc:
            marks.exit(token)
            marks.on_error("ddp", exc)
            return fut

    watchdog_comm_hook.watchdog_comm_hook = True  # type: ignore[attr-defined]  # zero-code mode: ours, not the user's
    model.register_comm_hook(state, watchdog_comm_hook)
