"""The hook's two deliberate copies write exactly what the generic paths write.

For speed, the patched torch collectives (collectives.make_collective_wrapper)
write CollectiveMarks.enter and its synchronous exit out in their own body, and
the loader's iterator (loader.TimedIterator) writes its data-wait marks out
instead of calling a recorder method. Each scenario below is played twice, on
two fresh slots with identical fake clocks: once through those inlined copies
("inline"), once through the generic paths ("generic": ``marks.enter`` /
``exit`` / ``exit_on_completion`` as ``mon.collective`` and the DDP hook use
them, and data waits as two ``SlotWriter.write`` brackets plus the step's data
accounting). The slots must end byte-identical: seq counts, header words, ring
records, ring head. Then: a quiet, closed, disabled or forked-child monitor
makes the inlined copies plain calls that write nothing.
"""

from __future__ import annotations

import threading

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import CollOp
from watchdog.hook.lifecycle import installer as lifecycle
from watchdog.hook.marks.loader import TimedIterator
from watchdog.hook.marks.recorder import Recorder
from watchdog.hook.slot.slotwriter import SlotWriter
from watchdog.hook.testing import ENV_VARS, FakeClock, installed
from watchdog.hook.zero_code.collectives import Sink, make_wrapper

IDENT = wire.Identity(job="j", host="h", rank=1, local_rank=1, world_size=4, pid=4321, proc_start_us=77, run_id="r:0")
T0 = 1_000_000_000
OP = int(CollOp.ALL_REDUCE)


class CollectiveFailed(Exception):
    """The collective's own error (the user's, not the hook's)."""


class LoaderFailed(Exception):
    """The loader's own error."""


class Group:
    group_name = "sub"  # GroupTable names a group by this attribute when torch is not patched


SUB = Group()


class Payload:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class FakeFuture:
    def __init__(self) -> None:
        self.callbacks: list = []

    def then(self, cb):
        self.callbacks.append(cb)
        return self


class FakeWork:
    """What an async_op=True collective returns: completes when the test says."""

    def __init__(self) -> None:
        self.fut = FakeFuture()

    def get_future(self) -> FakeFuture:
        return self.fut

    def complete(self) -> None:
        for cb in self.fut.callbacks:
            cb(self.fut)


class ScriptedLoader:
    """``next()`` takes ``took`` ns of the fake clock, then returns or raises ``outcome``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.plan: list = []

    def __iter__(self):
        return self

    def __next__(self):
        took, outcome = self.plan.pop(0)
        self.clock.advance(took)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class Side:
    """A recorder on a fresh 4-record slot, its own fake clock, its errors."""

    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.errors: list = []
        self.slot = SlotWriter.format(bytearray(wire.slot_size(4)), IDENT, 4, wall_ns=5, mono_ns=T0)
        self.rec = Recorder(
            self.slot, self.clock, T0, on_error=lambda where, exc: self.errors.append((where, type(exc))),
            on_control_due=lambda n: None,
        )  # fmt: skip
        self.marks = self.rec.collectives
        self.loader = ScriptedLoader(self.clock)

    def step(self) -> None:
        self.clock.advance(5)
        self.rec.step()

    # What a scenario does, each side its own way (Inline, Generic):
    def collective(self, took, group=None, nbytes=64, async_op=False, fails=False, during=None):
        raise NotImplementedError

    def fetch(self, took, outcome):
        raise NotImplementedError


class Inline(Side):
    """Through the copies: the patched collective and the loader's iterator."""

    def __init__(self) -> None:
        super().__init__()
        self.sink = Sink()
        self.sink.marks = self.marks
        self.plan: dict = {}

        def all_reduce(tensor, op=None, group=None, async_op=False):  # torch's signature
            self.clock.advance(self.plan["took"])
            if self.plan["during"] is not None:
                self.plan["during"](self)
            if self.plan["fails"]:
                raise CollectiveFailed
            return FakeWork() if async_op else None

        self.all_reduce = make_wrapper(all_reduce, CollOp.ALL_REDUCE, "tensor", False, self.sink, FakeWork)
        self.batches = TimedIterator(self.loader, self.rec)

    def collective(self, took, group=None, nbytes=64, async_op=False, fails=False, during=None):
        self.plan = {"took": took, "fails": fails, "during": during}
        if group is None and not async_op:
            return self.all_reduce(Payload(nbytes))  # positional only: the wrapper's other parsing branch
        return self.all_reduce(Payload(nbytes), group=group, async_op=async_op)

    def fetch(self, took, outcome):
        self.loader.plan.append((took, outcome))
        return next(self.batches)


class Generic(Side):
    """Through the generic paths."""

    def collective(self, took, group=None, nbytes=64, async_op=False, fails=False, during=None):
        token = self.marks.enter(OP, group, nbytes)
        self.clock.advance(took)
        if during is not None:
            during(self)
        if fails:
            if token is not None:
                self.marks.exit_failed(token)
            raise CollectiveFailed
        if async_op:
            work = FakeWork()
            if token is not None:
                self.marks.exit_on_completion(work, token)
            return work
        if token is not None:
            self.marks.exit(token)
        return None

    def fetch(self, took, outcome):
        """A data wait: "waiting since t0" and "done at now", one bracket each, and
        the wait added to the step in progress (its STEP_END record's data words)."""
        self.loader.plan.append((took, outcome))
        t0 = self.clock()
        self.slot.write(((wire.H_DATA_ENTER_NS, t0),))
        try:
            return next(self.loader)
        finally:
            now = self.clock()
            self.rec._acc_data += now - t0
            self.rec._n_data += 1
            self.slot.write(((wire.H_DATA_EXIT_NS, now),))


# -- the scenarios: each takes a side and returns nothing; time moves by numbers ------------


def sync_collectives_wrap_the_ring(s: Side) -> None:
    for i in range(6):
        assert s.fetch(30, i) == i  # the batch passes through
        s.clock.advance(100)
        assert s.collective(200, nbytes=64 * (i + 1)) is None
        s.step()


def async_collective_completes_later(s: Side) -> None:
    s.fetch(30, "batch")
    work = s.collective(100, async_op=True)
    s.clock.advance(50)
    s.fetch(20, "next")
    s.clock.advance(40)
    work.complete()
    s.step()
    s.collective(10)
    s.step()


def collective_spans_a_step_boundary(s: Side) -> None:
    work = s.collective(100, group=SUB, async_op=True)
    s.clock.advance(50)
    s.step()  # the open collective's time so far goes to this step
    s.clock.advance(70)
    work.complete()
    s.collective(10)
    s.step()


def nested_and_overlapping_collectives(s: Side) -> None:
    a = s.collective(100, async_op=True)
    b = s.collective(30, group=SUB, async_op=True)
    s.collective(40, group=SUB)  # a third, synchronous, inside the two
    s.clock.advance(10)
    a.complete()  # completes out of order: b is still outstanding
    s.clock.advance(25)
    s.step()
    s.clock.advance(15)
    b.complete()
    c = s.collective(5, async_op=True)
    s.collective(5, group=SUB)
    c.complete()
    s.step()


def collective_raises(s: Side) -> None:
    with pytest.raises(CollectiveFailed):
        s.collective(100, group=SUB, fails=True)
    s.collective(20)
    s.step()


def bookkeeping_fails_on_an_unhashable_group(s: Side) -> None:
    s.collective(100, group=[])  # reported as the hook's error; the collective still runs
    s.collective(20)
    s.step()


def goes_quiet_while_a_collective_runs(s: Side) -> None:
    s.collective(20)
    s.step()
    s.collective(100, during=lambda side: side.rec.go_quiet())  # entered, then no exit mark
    s.step()  # quiet: a no-op


def loader_ends_and_raises(s: Side) -> None:
    assert s.fetch(30, 1) == 1
    with pytest.raises(StopIteration):
        s.fetch(5, StopIteration())
    with pytest.raises(LoaderFailed):
        s.fetch(7, LoaderFailed())
    assert s.fetch(11, 2) == 2  # still usable after both, as the user's iterator is
    s.collective(50)
    s.step()


SCENARIOS = [
    sync_collectives_wrap_the_ring,
    async_collective_completes_later,
    collective_spans_a_step_boundary,
    nested_and_overlapping_collectives,
    collective_raises,
    bookkeeping_fails_on_an_unhashable_group,
    goes_quiet_while_a_collective_runs,
    loader_ends_and_raises,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_inlined_copies_leave_the_bytes_of_the_generic_paths(scenario):
    inline, generic = Inline(), Generic()
    fresh = inline.slot.copy()
    scenario(inline)
    scenario(generic)
    assert inline.errors == generic.errors
    assert inline.slot.copy() == generic.slot.copy()
    assert inline.slot.copy() != fresh
    words = memoryview(inline.slot.copy()).cast("q")
    assert words[wire.H_SEQ] % 2 == 0 and words[wire.H_STEP] >= 1  # not vacuous: brackets closed, steps made


def test_the_unhashable_group_is_reported_once_on_each_side():
    inline = Inline()
    bookkeeping_fails_on_an_unhashable_group(inline)
    assert inline.errors == [("collective", TypeError)]


# -- quiet: the copies cannot be swapped for no-ops, so they ask ---------------------------


@pytest.mark.parametrize("how", ["recorder quiet", "sink cleared (unpatched)", "this thread suppressed"])
def test_the_patched_collective_is_a_plain_call_when_it_must_not_mark(how):
    s = Inline()
    if how == "recorder quiet":
        s.rec.go_quiet()
    elif how == "sink cleared (unpatched)":
        s.sink.marks = None
    else:
        s.marks.suppress_tid = threading.get_ident()  # inside watch_ddp's hook
    before = s.slot.copy()
    assert s.collective(100) is None
    work = s.collective(100, group=SUB, async_op=True)
    assert isinstance(work, FakeWork) and work.fut.callbacks == []  # nothing waits on it
    with pytest.raises(CollectiveFailed):
        s.collective(100, fails=True)
    assert s.slot.copy() == before and s.errors == []


def test_another_threads_suppression_does_not_silence_this_one():
    s = Inline()
    s.marks.suppress_tid = threading.get_ident() + 1
    before = s.slot.copy()
    s.collective(100)
    assert s.slot.copy() != before


def test_the_loader_is_a_plain_next_on_a_quiet_recorder():
    s = Inline()
    s.rec.go_quiet()
    before = s.slot.copy()
    assert s.fetch(30, 1) == 1
    with pytest.raises(StopIteration):
        s.fetch(5, StopIteration())
    with pytest.raises(LoaderFailed):
        s.fetch(5, LoaderFailed())
    assert s.slot.copy() == before and s.errors == [] and s.rec._n_data == 0


@pytest.mark.parametrize("how", ["closed", "disabled", "forked child"])
def test_wrappers_and_iterators_made_before_the_monitor_stopped_write_nothing(tmp_path, monkeypatch, how):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    clock = FakeClock(T0)
    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600, max_errors=1) as mon:
        sink = Sink()
        sink.marks = mon.recorder.collectives
        calls = []
        coll = make_wrapper(
            lambda tensor, group=None, async_op=False: calls.append(tensor), CollOp.ALL_REDUCE, "tensor", False, sink,
            FakeWork,
        )  # fmt: skip
        batches = iter(mon.wrap_loader(range(5)))
        assert next(batches) == 0
        coll(Payload(8))
        mon.step()
        assert mon.errors == 0 and mon.recorder.steps == 1
        path = mon.slot_path
        if how == "closed":
            mon.close()
        elif how == "disabled":
            mon.report_error("test", RuntimeError("the one error max_errors=1 allows"))
        else:
            lifecycle._after_fork_in_child()  # what os.register_at_fork runs in a child
            mon.heartbeat.stop()  # a real child has no such thread; this test's process does
        with open(path, "rb") as f:
            stopped = f.read()
        assert next(batches) == 1
        coll(Payload(8))
        coll(Payload(8), group=SUB)
        assert [next(batches), next(batches), next(batches)] == [2, 3, 4]
        with pytest.raises(StopIteration):
            next(batches)
        with open(path, "rb") as f:
            assert f.read() == stopped
        assert len(calls) == 3  # the collective itself always runs


def test_a_monitor_closed_during_a_fetch_or_a_collective_is_no_error(tmp_path, monkeypatch):
    """The copies keep the slot view they took at enter; close() releases it (slot
    writer detach) while the batch or the collective is still running."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        sink = Sink()
        sink.marks = mon.recorder.collectives

        def closing_all_reduce(tensor, group=None, async_op=False):
            mon.close()
            return "reduced"

        coll = make_wrapper(closing_all_reduce, CollOp.ALL_REDUCE, "tensor", False, sink, FakeWork)
        assert coll(Payload(8)) == "reduced"
        assert mon.errors == 0
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=3600) as mon:

        def closing_loader():
            mon.close()
            yield "batch"

        assert list(mon.wrap_loader(closing_loader())) == ["batch"]
        assert mon.errors == 0
