"""The one writer of a rank's slot: every store into the mapping goes through here.

Seqlock. Words H_STEP .. H_LAST_DYNAMIC (and the ring) change only between an
odd and an even store of H_SEQ: the bracket ``with seqlocked(slot) as w:``,
defined once below, and nothing else in the process stores H_SEQ.
``self._seq`` is our own copy: the slot is never read back, so garbage written
into it by someone else cannot steer us. The lock makes each bracket safe
against the other writers in this process (DDP comm-hook callbacks and async
collectives complete on the backend's thread) and is held only for the stores;
it is reentrant so that a signal handler marking a phase while the main thread
is inside a bracket cannot deadlock (the reader may then accept that one header
early: the price of never blocking).

What goes inside the bracket is the caller's (the recorder knows what the
words mean; this module knows how they may change). Why a bracket rather than
one method taking the words: the hot paths store a few contiguous words with
one precompiled struct pack, and passing those values through a generic call
(a tuple, then ``*args``) costs ~200 ns (benchmarks/hook_overhead.py).

The bracket written once, at no cost. The hot paths, ``Recorder.step``
(recorder.py), ``CollectiveMarks.enter``/``exit`` (collective_marks.py), their
copy in the patched collectives (collectives.py) and the loader's data-wait
marks (loader.py), are decorated with ``inline_seqlock``: at import it splices
``seqlocked``'s statements into them, on this object's ``_words`` and ``_seq``,
because any call costs more than the stores it brackets. ``Recorder.step`` also
appends its ring record itself (``_head``, ``_ring0``, ``_cap``: ``append``
written out). Nothing else touches those; tests/test_hook_slotwriter.py plays
the hot paths spliced and through the generator, and with
tests/test_hook_inline.py proves they leave the bytes ``write`` would.

Single-writer words (status, heartbeat, control acks) sit outside the seqlock
and are stored alone with ``put``.
"""

from __future__ import annotations
import __future__

import ast
import functools
import inspect
import operator
import struct
import textwrap
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import (
    H_EVENT_RING_HEAD,
    H_RING_HEAD,
    H_SEQ,
    R_A,
    R_INDEX,
    R_KIND,
    R_L,
    R_STEP,
    R_T_NS,
    WORD,
)

REC_BYTES = wire.RECORD_WORDS * WORD
_PAD = (0,) * (wire.RECORD_WORDS - 4)
# A ring record's words, R_INDEX .. R_L, in one pack (native order, as
# wire.init_slot writes: the slot is little-endian and so are the hosts).
pack_record = struct.Struct("16q").pack_into

if (R_INDEX, R_KIND, R_T_NS, R_STEP, R_A, R_L, wire.RECORD_WORDS) != (0, 1, 2, 3, 4, 15, 16):  # pragma: no cover
    raise ImportError("watchdog.hook.slot.slotwriter: wire record layout changed; update pack_record")

# -- the seqlock bracket, written once ------------------------------------------------


def _bracket(slot: SlotWriter) -> Iterator[Any]:
    """The seqlock bracket (``seqlocked``). The caller holds ``slot.lock``; the block gets the
    slot's int64 words to store into (``w[i] = v`` or a struct pack at a byte
    offset): H_SEQ is odd before its first store and even after its last, even
    when a store raises.

    This generator is the bracket's one definition. The hot paths write
    ``with seqlocked(slot) as w:`` in functions decorated with ``inline_seqlock``,
    which splices this body into them at import (a ``with`` on a generator costs
    ~0.5 µs, more than the stores it brackets); the cold paths call it as is."""
    w = slot._words
    s = slot._seq + 1
    w[H_SEQ] = s
    try:
        yield w
    finally:
        s += 1
        w[H_SEQ] = s
        slot._seq = s


seqlocked = contextmanager(_bracket)
_FUTURE_FLAGS = functools.reduce(
    operator.or_, (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names), 0
)
F = TypeVar("F", bound=Callable[..., Any])


def inline_seqlock(fn: F) -> F:
    """Recompile ``fn`` with each ``with seqlocked(<name>) as <name>:`` in it
    (nested functions included) replaced by ``seqlocked``'s own body, the block
    where it yields, and its globals (H_SEQ) as constants: the bracket's
    statements, with no call. Same file and line numbers, so tracebacks and
    coverage point at the source. Where the source cannot be read (a bytecode-only
    install), ``fn`` is returned as is: the ``with`` then runs the generator, the
    same stores a little slower. A ``with seqlocked`` this cannot splice (not a
    plain name on both sides) is an ImportError: a hot path must not go slow unseen."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        _template()
    except (OSError, TypeError):
        return fn
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef) or fn.__code__.co_freevars:
        raise ImportError(f"inline_seqlock: {fn.__qualname__} must be a plain def (not a closure)")
    if [ast.unparse(d) for d in fdef.decorator_list] != [inline_seqlock.__name__]:
        raise ImportError(f"inline_seqlock: {fn.__qualname__} must have this one decorator")
    fdef.decorator_list = []
    splicer = _Splice(fn.__qualname__)
    splicer.visit(fdef)
    if not splicer.spliced:
        raise ImportError(f"inline_seqlock: {fn.__qualname__} has no `with seqlocked(slot) as w:`")
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    code = compile(tree, fn.__code__.co_filename, "exec", flags=fn.__code__.co_flags & _FUTURE_FLAGS, dont_inherit=True)
    namespace: dict[str, Any] = {}
    exec(code, fn.__globals__, namespace)
    out = namespace[fn.__name__]
    out.__qualname__ = fn.__qualname__
    out.__seqlock_inlined__ = True
    out.__wrapped__ = fn  # the same stores through the generator (tests play both)
    return out


def _template() -> tuple[str, str, list[ast.stmt]]:
    """``seqlocked``'s parameter, the name it yields, and its body less the docstring."""
    fdef = ast.parse(textwrap.dedent(inspect.getsource(_bracket))).body[0]
    assert isinstance(fdef, ast.FunctionDef)
    body = [st for st in fdef.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    (yielded,) = [n.value for n in ast.walk(fdef) if isinstance(n, ast.Yield)]
    assert isinstance(yielded, ast.Name)
    return fdef.args.args[0].arg, yielded.id, body


class _Splice(ast.NodeTransformer):
    def __init__(self, where: str) -> None:
        self.where = where
        self.spliced = 0

    def visit_With(self, node: ast.With) -> Any:
        self.generic_visit(node)  # a nested def may hold one
        *outer, last = node.items
        call = last.context_expr
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "seqlocked"):
            return node
        target = last.optional_vars
        if (
            len(call.args) != 1
            or not isinstance(call.args[0], ast.Name)
            or not isinstance(target, (ast.Name, type(None)))
        ):
            raise ImportError(f"inline_seqlock: {self.where} line {node.lineno}: write `seqlocked(<name>) as <name>`")
        param, yielded, body = _template()  # parsed afresh: the splice edits it in place
        names = {param: call.args[0].id, yielded: target.id if target is not None else f"_seqlock_{yielded}"}
        self.spliced += 1
        theirs = {id(n) for st in node.body for n in ast.walk(st)}
        out = [_Rename(names, node.body).visit(st) for st in body]
        for st in out:
            for n in ast.walk(st):
                if id(n) not in theirs and isinstance(n, (ast.stmt, ast.expr)):  # the bracket's lines: the with's
                    n.lineno = n.end_lineno = node.lineno
                    n.col_offset, n.end_col_offset = node.col_offset, call.end_col_offset
        if outer:  # ``with lock, seqlocked(slot) as w:``: the lock's with holds the bracket
            node.items, node.body = outer, out
            return node
        return out


class _Rename(ast.NodeTransformer):
    """In the template: the slot and the words take the caller's names, other
    locals a prefix, globals their value (ints: the word indices), and the
    ``yield`` the caller's block."""

    def __init__(self, names: dict[str, str], block: list[ast.stmt]) -> None:
        self.names = names
        self.block = block

    def visit_Expr(self, node: ast.Expr) -> Any:
        if isinstance(node.value, ast.Yield):
            return self.block
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in self.names:
            return ast.Name(self.names[node.id], node.ctx)
        if node.id in _TEMPLATE_LOCALS:
            return ast.Name(f"_seqlock_{node.id}", node.ctx)
        value = globals()[node.id]
        if not isinstance(value, int):
            raise ImportError(f"inline_seqlock: the bracket's global {node.id} is not an int constant")
        return ast.Constant(value)


_TEMPLATE_LOCALS = frozenset(_bracket.__code__.co_varnames)


class SlotWriter:
    """Owns the mapping, its int64 view, the seqlock counter, the ring head and
    the lock. ``buf`` must already be formatted (``format`` does both)."""

    __slots__ = ("_buf", "_cap", "_ev0", "_ev_cap", "_ev_head", "_head", "_ring0", "_seq", "_words", "lock")

    def __init__(self, buf: Any, ring_capacity: int) -> None:
        self.lock = threading.RLock()
        self._buf = buf
        self._words = memoryview(buf).cast("q")
        self._seq = 0
        self._head = 0
        self._cap = ring_capacity
        self._ring0 = wire.RING_OFFSET
        # The event ring (wire version 2): written on the cold paths only.
        self._ev0 = wire.event_ring_offset(ring_capacity)
        self._ev_cap = wire.EVENT_RING_FACTOR * ring_capacity
        self._ev_head = 0

    @classmethod
    def format(cls, buf: Any, identity: wire.Identity, ring_capacity: int, *, wall_ns: int, mono_ns: int) -> SlotWriter:
        """Format ``buf`` as a fresh slot for ``identity`` and return its writer."""
        wire.init_slot(buf, identity, ring_capacity, wall_ns=wall_ns, mono_ns=mono_ns)
        return cls(buf, ring_capacity)

    @property
    def words(self) -> memoryview:
        """The slot as int64 words, for reading the agent's control block."""
        return self._words

    def append(
        self,
        kind: int,
        t_ns: int,
        step: int,
        a: int = 0,
        b: int = 0,
        c: int = 0,
        d: int = 0,
        e: int = 0,
        f: int = 0,
        g: int = 0,
        h: int = 0,
        i: int = 0,
        j: int = 0,
        k: int = 0,
        l: int = 0,  # noqa: E741
    ) -> None:
        """Inside a bracket: write the next ring record (payload words R_A .. R_L)
        and advance H_RING_HEAD past it."""
        head = self._head
        pack_record(
            self._words,
            self._ring0 + (head % self._cap) * REC_BYTES,
            head, kind, t_ns, step, a, b, c, d, e, f, g, h, i, j, k, l,
        )  # fmt: skip
        head += 1
        self._words[H_RING_HEAD] = head
        self._head = head

    def append_wide(self, kind: int, t_ns: int, step: int, payload: tuple[int, ...]) -> None:
        """Inside a bracket: like ``append`` with all twelve payload words (R_A ..
        R_L; fewer are zero-filled)."""
        if len(payload) > wire.RECORD_WORDS - 4:
            raise ValueError(f"a record holds {wire.RECORD_WORDS - 4} payload words, got {len(payload)}")
        self.append(kind, t_ns, step, *payload)

    @inline_seqlock
    def write_wide(self, records: Iterable[tuple[int, int, int, tuple[int, ...]]]) -> None:
        """The cold path: append wide records ``(kind, t_ns, step, payload)``, in one bracket."""
        with self.lock, seqlocked(self):
            for kind, t_ns, step, payload in records:
                self.append_wide(kind, t_ns, step, payload)

    @inline_seqlock
    def write_events(self, records: Iterable[tuple[int, int, int, tuple[int, ...]]]) -> None:
        """The event ring's one writer (background thread: Flight Recorder
        signatures, GPU completions): records ``(kind, t_ns, step, payload)`` in
        one bracket, so a burst of collectives never pushes out step records."""
        with self.lock, seqlocked(self) as w:
            head, cap = self._ev_head, self._ev_cap
            for kind, t_ns, step, payload in records:
                if len(payload) > wire.RECORD_WORDS - 4:
                    raise ValueError(f"a record holds {wire.RECORD_WORDS - 4} payload words, got {len(payload)}")
                pack_record(
                    w, self._ev0 + (head % cap) * REC_BYTES, head, kind, t_ns, step, *payload, *_PAD[len(payload) :]
                )
                head += 1
                w[H_EVENT_RING_HEAD] = head
                self._ev_head = head

    @inline_seqlock
    def write(self, words: Iterable[tuple[int, int]] = (), record: tuple | None = None) -> None:
        """The cold path: store header words (index, value) and append at most one
        record ``(kind, t_ns, step, *payload)``, in one bracket."""
        with self.lock, seqlocked(self) as w:
            for index, value in words:
                w[index] = value
            if record is not None:
                self.append(*record)

    # -- outside the seqlock -------------------------------------------------------

    def put(self, index: int, value: int) -> None:
        """Store one single-writer word read on its own, outside the seqlock
        (status, heartbeat, control acknowledgement). One aligned 8-byte store."""
        if wire.seqlocked(index):
            raise ValueError(f"word {index} changes only inside a seqlock bracket")
        self._words[index] = value

    def copy(self) -> bytes:
        """The whole slot as bytes (tests)."""
        return self._words.tobytes()

    def detach(self) -> None:
        """Point later stores at scratch memory and unmap: a writer still in
        flight on another thread (a collective's callback) lands harmlessly."""
        with self.lock:
            w, buf = self._words, self._buf
            self._buf = bytearray(len(buf))
            self._words = memoryview(self._buf).cast("q")
        try:
            w.release()
            buf.close()
        except Exception:
            pass  # a view is still exported: the mapping goes with the process
