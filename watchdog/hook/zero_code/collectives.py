"""Patching ``torch.distributed``'s collectives and process-group lifecycle.

Each collective function is replaced, under both ``torch.distributed.X`` and
``torch.distributed.distributed_c10d.X`` (the same object in torch 2.x), by a
wrapper that marks enter, calls the original, and marks exit. For ``async_op``
calls the original returns a Work: exit is marked when its future completes
(``work.get_future().then``), on the backend's thread. Work that has no future
(e.g. the placeholder returned inside a coalescing manager) is marked complete
at once. Code that captured a function before install (``from torch.distributed
import all_reduce``) keeps the original: documented, not chased.

On CUDA (NCCL) a collective returns once enqueued and its future completes
with the stream, so "exit" there is the enqueue time; timing GPU-side
completion needs CUDA events, which this CPU-only version does not do.

Imports torch only when called (the agent environment has no torch).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from watchdog.contracts.slot import H_PG_STATE, CollOp, PgState
from watchdog.hook.marks.collective_marks import _COLL_OFF, _EXIT_OFF, _pack_coll, _pack_exit
from watchdog.hook.slot.slotwriter import inline_seqlock, seqlocked
from watchdog.hook.zero_code import initstore

log = logging.getLogger("watchdog.hook")

# name -> (op, the argument whose size is this rank's payload, is it a list of tensors)
SPECS: dict[str, tuple[CollOp, str | None, bool]] = {
    "all_reduce": (CollOp.ALL_REDUCE, "tensor", False),
    "broadcast": (CollOp.BROADCAST, "tensor", False),
    "all_gather": (CollOp.ALL_GATHER, "tensor", False),
    "all_gather_into_tensor": (CollOp.ALL_GATHER, "input_tensor", False),
    "all_gather_single": (CollOp.ALL_GATHER, "input_tensor", False),  # FSDP2's (torch >= 2.13)
    "reduce_scatter": (CollOp.REDUCE_SCATTER, "input_list", True),
    "reduce_scatter_tensor": (CollOp.REDUCE_SCATTER, "input", False),
    "reduce_scatter_single": (CollOp.REDUCE_SCATTER, "input", False),  # FSDP2's (torch >= 2.13)
    "barrier": (CollOp.BARRIER, None, False),
    "all_to_all": (CollOp.ALL_TO_ALL, "input_tensor_list", True),
    "all_to_all_single": (CollOp.ALL_TO_ALL, "input", False),
    "reduce": (CollOp.REDUCE, "tensor", False),
    "gather": (CollOp.GATHER, "tensor", False),
    "scatter": (CollOp.SCATTER, "tensor", False),
    "send": (CollOp.SEND, "tensor", False),
    "recv": (CollOp.RECV, "tensor", False),
}


# Deprecated names that newer torch implements by calling the new one (through the
# module global, which we patch too): wrapping both would count each call twice.
DELEGATES = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}


def delegates(fn: Callable, name: str, module: Any) -> bool:
    """``fn`` (collective ``name``) only calls another collective we patch."""
    target = DELEGATES.get(name)
    try:
        code = getattr(inspect.unwrap(fn), "__code__", None)  # under torch's logging/deprecation decorators
    except ValueError:
        code = None
    return target is not None and getattr(module, target, None) is not None and target in getattr(code, "co_names", ())


class Sink:
    """Where wrappers find the monitor's recorder and its collective marks.
    Cleared at unpatch: a wrapper that someone else captured (or wrapped again)
    then simply calls the original."""

    recorder: Any = None
    marks: Any = None


def _positions(fn: Callable, *names: str | None) -> list[int]:
    """Positional index of each named parameter of ``fn`` (a large number if absent)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    return [params.index(n) if n in params else 1 << 30 for n in names]


@inline_seqlock
def make_collective_wrapper(
    orig: Callable,
    op: int,
    group_pos: int,
    size_pos: int,
    size_arg: str | None,
    is_list: bool,
    work_type: type | None,
    sink: Any,
) -> Callable:
    """The function that replaces a torch collective: find the collective marks
    (``sink.marks``), size the payload, mark enter, call ``orig``, mark exit.
    A Work returned by async_op=True is marked complete when its future is, on
    the backend's thread.

    The marks are ``CollectiveMarks.enter`` and its synchronous ``exit`` written
    out here, on the marks' and the slot writer's fields: the wrapper is the only
    frame the hook adds to a collective (the calls and their token tuple cost ~8%
    of a step's hook time). A deliberate copy of collective_marks.py's, which the
    cold paths (async completion, a raising collective) still call;
    tests/test_hook_inline.py proves both leave identical slot bytes, and that a
    quiet marks object makes this a plain call of ``orig``.

    ``group_pos``/``size_pos``: positional index of ``group`` and of the tensor(s)
    to size (huge: keyword only); ``size_arg``: that argument's name (None: no
    payload, barrier); ``work_type``: what async_op=True returns (None: unknown)."""
    get_ident = threading.get_ident
    op = int(op)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        m = sink.marks
        if m is None or m.quiet or (m.suppress_tid and m.suppress_tid == get_ident()):
            return orig(*args, **kwargs)
        try:
            n = len(args)
            if kwargs:
                group = args[group_pos] if n > group_pos else kwargs.get("group")
                t = args[size_pos] if n > size_pos else kwargs.get(size_arg or "")
            else:
                group = args[group_pos] if n > group_pos else None
                t = args[size_pos] if n > size_pos else None
            # no payload (barrier, a missing argument), a list of tensors, or one tensor
            nbytes = 0 if t is None else sum(getattr(x, "nbytes", 0) for x in t) if is_list else getattr(t, "nbytes", 0)
            # -- CollectiveMarks.enter, written out ---------------------------------
            clock = m._clock  # callables kept in slots are called through a local (3.11 specialises that)
            now = clock()
            st = m._by_handle.get(group)
            if st is None:
                st = m.groups.add(group)
            slot = m._slot
            lock = slot.lock
            lock.acquire()
            try:
                seq = st.seq + 1
                st.seq = seq
                out = m.outstanding + 1
                if out == 1:
                    m.span_start = now
                m.outstanding = out
                m.this_step_count += 1
                m.this_step_bytes += nbytes
                m.current = st
                with seqlocked(slot) as w:
                    _pack_coll(w, _COLL_OFF, st.key, seq, op, nbytes, now, m._last_exit, out, st.done)
            finally:
                lock.release()
        except Exception as exc:
            m.on_error("collective", exc)
            return orig(*args, **kwargs)
        try:
            ret = orig(*args, **kwargs) if kwargs else orig(*args)
        except BaseException:
            m.exit_failed((st, seq))
            raise
        if ret is not None and work_type is not None and isinstance(ret, work_type):
            m.exit_on_completion(ret, (st, seq))
            return ret
        # Closed or disabled while the collective ran: like the generic exit, now a no-op.
        # (A close racing past this check stores into the slot writer's scratch memory.)
        if m.quiet:
            return ret
        # -- CollectiveMarks.exit, written out --------------------------------------
        try:
            now = clock()
            lock.acquire()
            try:
                out = m.outstanding
                if out:
                    out -= 1
                    m.outstanding = out
                    if not out:  # the union of overlapping collectives ends here
                        m.this_step_ns += now - m.span_start
                if seq > st.done:
                    st.done = seq
                m._last_exit = now
                with seqlocked(slot) as w:
                    # DONE_SEQ describes H_COLL_GROUP: rewrite it with that group's value
                    _pack_exit(w, _EXIT_OFF, now, out, m.current.done)
            finally:
                lock.release()
        except Exception as exc:
            m.on_error("collective", exc)
        return ret

    return wrapper


def make_wrapper(
    orig: Callable, op: CollOp, size_arg: str | None, is_list: bool, sink: Sink, work_type: type | None
) -> Callable[..., Any]:
    """The wrapper for one collective (the marking is the recorder's). Public so
    the benchmark can wrap a no-op exactly as install() wraps all_reduce."""
    group_pos, size_pos = _positions(orig, "group", size_arg)
    wrapper = make_collective_wrapper(orig, op, group_pos, size_pos, size_arg, is_list, work_type, sink)
    functools.update_wrapper(wrapper, orig)
    wrapper.watchdog_wrapper = True  # type: ignore[attr-defined]
    return wrapper


def _group_name_fn(c10d: Any) -> Callable[[Any], str]:
    get_name = getattr(c10d, "_get_process_group_name", None)

    def name(pg: Any) -> str:
        n = get_name(pg) if get_name is not None else "None"
        if n == "None":  # not registered with c10d: fall back to the object's own name
            n = getattr(pg, "group_name", "") or ""
        return str(n)

    return name


def _work_type(dist: Any) -> Any:
    """What ``async_op=True`` returns (None: unknown)."""
    try:
        from torch._C._distributed_c10d import Work

        return Work
    except ImportError:  # pragma: no cover - very old or stripped builds
        return getattr(dist, "Work", None)


def patch(mon: Any) -> None:
    """Install wrappers feeding ``mon.recorder``; registers their removal with ``mon.add_undo``."""
    import torch.distributed as dist

    if not dist.is_available():
        log.debug("watchdog.hook torch.distributed unavailable; collectives not patched")
        return
    c10d = dist.distributed_c10d
    rec = mon.recorder
    sink = Sink()
    sink.recorder = rec
    sink.marks = rec.collectives
    work_type = _work_type(dist)
    rec.collectives.groups.name_of = _group_name_fn(c10d)

    replaced: list[tuple[Any, str, Any, Any]] = []  # (module, name, original, wrapper)

    def install(name: str, wrapper: Callable, orig: Callable) -> None:
        for module in (dist, c10d):
            if getattr(module, name, None) is orig:
                setattr(module, name, wrapper)
                replaced.append((module, name, orig, wrapper))

    tracker = getattr(mon, "completions", None)  # decided at install: None on a CPU-only machine
    for name, (op, size_arg, is_list) in SPECS.items():
        orig = getattr(c10d, name, None) or getattr(dist, name, None)
        if orig is None or getattr(orig, "watchdog_wrapper", False) or delegates(orig, name, c10d):
            continue
        wrapper = make_wrapper(orig, op, size_arg, is_list, sink, work_type)
        if tracker is not None:
            from watchdog.hook.completion.tracker import with_completion

            wrapper = with_completion(wrapper, lambda: sink.marks, tracker, lambda: rec.steps)
        install(name, wrapper, orig)

    init = getattr(c10d, "init_process_group", None)
    if init is not None and not getattr(init, "watchdog_wrapper", False):
        restart_safe = bool(getattr(getattr(mon, "config", None), "restart_safe_init", False))
        install("init_process_group", _wrap_init(init, sink, restart_safe), init)
    destroy = getattr(c10d, "destroy_process_group", None)
    if destroy is not None and not getattr(destroy, "watchdog_wrapper", False):
        install("destroy_process_group", _wrap_destroy(destroy, sink, dist), destroy)

    def unpatch() -> None:
        sink.recorder = sink.marks = None
        for module, name, orig, wrapper in reversed(replaced):
            if getattr(module, name, None) is wrapper:  # someone re-wrapped us: leave theirs
                setattr(module, name, orig)

    mon.add_undo(unpatch)
    if dist.is_initialized():
        rec.set_pg(PgState.JOINED)
    watch = getattr(mon, "watch_pg", None)
    if watch is not None:
        watch(joined_poll(dist.is_initialized, mon.slot.words, rec.set_pg))


def joined_poll(initialized: Callable[[], bool], words: Any, set_pg: Callable[[PgState], None]) -> Callable[[], None]:
    """For the heartbeat: a default group that exists while the slot still says none
    (or destroyed) was made by a call our wrapper never saw: a reference to
    init_process_group taken before install, a framework's own path. The slot then
    says joined, at the next beat: a word read per beat, and ``is_initialized()``
    (a module attribute test) only while the slot says no group. Our wrapper's own
    init says initializing first, so it never races this."""
    idle = (int(PgState.NONE), int(PgState.DESTROYED))

    def poll() -> None:
        if words[H_PG_STATE] in idle and initialized():
            set_pg(PgState.JOINED)

    return poll


def _wrap_init(orig: Callable, sink: Sink, restart_safe: bool = False) -> Callable:
    """``restart_safe``: a default init under torchrun runs on a store scoped to
    the restart attempt (``initstore``); a failure to plan that is the hook's
    (counted, and the call goes through as given)."""

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        r = sink.recorder
        if r is None:
            return orig(*args, **kwargs)
        r.set_pg(PgState.INITIALIZING)
        scoped = None
        if restart_safe:
            try:
                scoped = initstore.plan(orig, args, kwargs, os.environ)
            except Exception as exc:
                r.on_error("restart_safe_init", exc)
        try:
            ret = orig(**initstore.rendezvous(scoped)) if scoped is not None else orig(*args, **kwargs)
        except BaseException:
            r.set_pg(PgState.NONE)
            raise
        r.collectives.reset_groups()  # a new default group: sequence numbers restart on every rank
        r.set_pg(PgState.JOINED)
        return ret

    functools.update_wrapper(init_process_group, orig)
    init_process_group.watchdog_wrapper = True  # type: ignore[attr-defined]
    return init_process_group


def _wrap_destroy(orig: Callable, sink: Sink, dist: Any) -> Callable:
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("group")
        ret = orig(*args, **kwargs)
        r = sink.recorder
        if r is not None:
            try:
                whole = group is None or group is getattr(dist.GroupMember, "WORLD", None) or not dist.is_initialized()
            except Exception:
                whole = group is None
            if whole:
                r.collectives.reset_groups()
                r.set_pg(PgState.DESTROYED)
            else:
                r.collectives.reset_groups(group)
        return ret

    functools.update_wrapper(destroy_process_group, orig)
    destroy_process_group.watchdog_wrapper = True  # type: ignore[attr-defined]
    return destroy_process_group
