"""Progress a rank makes without the script reporting it (watchdog.hook.marks.progress):
the pure rules (when the forward hook is armed, when the automatic eval phase
opens and closes), then the real hooks on a real model in process, the heartbeat
driven by hand on a clock the test sets."""

from __future__ import annotations

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Phase, RecordKind
from watchdog.hook.marks.progress import CLOSE, OPEN, STAY, Beat, decide, should_arm

S = 1_000_000_000


def beat(train=0, eval=0, backward=0, optimizer=0, steps=5, coll=(0, 10), ring=5, data=False) -> Beat:
    return Beat(train, eval, backward, optimizer, steps, coll, ring, data)


B0 = beat()


@pytest.mark.parametrize(
    ("steps", "age_s", "last_s", "armed"),
    [
        (5, 0.2, 0.1, False),  # a normal step
        (5, 0.9, 0.1, False),  # long, but under the 1 s floor
        (5, 1.1, 0.1, True),  # an evaluation (or a hang): count forwards
        (5, 3.0, 2.0, False),  # slow steps: 2x the last before arming
        (5, 4.1, 2.0, True),
        (0, 30.0, 0.0, False),  # before the first step ends (a model compiling in its first forward)
    ],
)
def test_the_forward_hook_is_armed_only_in_a_step_much_longer_than_the_last(steps, age_s, last_s, armed):
    assert should_arm(steps, int(age_s * S), int(last_s * S)) is armed


@pytest.mark.parametrize(
    ("auto", "can_open", "cur", "opened", "still_s", "want"),
    [
        # closed: opens on a beat of eval forwards and nothing of a training step
        (False, True, beat(eval=40), None, 0, OPEN),
        (False, False, beat(eval=40), None, 0, STAY),  # a phase is open (explicit wins)
        (False, True, beat(eval=40, train=3), None, 0, STAY),  # a frozen backbone: train forwards too
        (False, True, beat(eval=40, backward=1), None, 0, STAY),  # a teacher's forward in a training step
        (False, True, beat(eval=40, optimizer=1), None, 0, STAY),
        (False, True, beat(eval=40, steps=6), None, 0, STAY),
        (False, True, beat(train=40), None, 0, STAY),  # training forwards
        (False, True, B0, None, 9, STAY),  # nothing ran: a hang is not an evaluation
        # open: stays while it works alone, in a data wait, or back to training forwards
        (True, False, beat(eval=80), B0, 0, STAY),
        (True, False, beat(eval=80, train=5, backward=1), B0, 0, STAY),  # not in the collective yet
        (True, False, beat(eval=80, data=True), B0, 30, STAY),  # its loader: bounded by the allowance
        # closes when it is back in the job, or stops working
        (True, False, beat(eval=80, steps=6), B0, 0, CLOSE),
        (True, False, beat(eval=80, coll=(0, 11)), B0, 0, CLOSE),
        (True, False, beat(eval=80), B0, 2, CLOSE),  # nothing moved for stale_s: a spin, a deadlock
        (True, False, beat(eval=80), B0, 1, STAY),
    ],
)
def test_the_automatic_eval_phase(auto, can_open, cur, opened, still_s, want):
    assert decide(auto, can_open, B0, cur, opened, int(still_s * S), 2 * S) == want


torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from watchdog.hook.testing import ENV_VARS, installed, read_monitor, records_of  # noqa: E402


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


class Clock:
    def __init__(self) -> None:
        self.ns = 10 * S

    def __call__(self) -> int:
        return self.ns


def phases(mon) -> list[tuple[int, int]]:
    """(entered, left) of every phase record."""
    return [(r.payload[0], r.payload[1]) for r in records_of(read_monitor(mon), RecordKind.PHASE)]


def test_an_unmarked_evaluation_is_an_eval_phase_and_a_stall_after_it_is_not(tmp_path):
    clock = Clock()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with installed(tmp_path, clock=clock, heartbeat_interval_s=3600, patch_collectives=False) as mon:
        prog = mon.progress

        def train_step():
            model.train()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            clock.ns += S // 10
            mon.step()

        for _ in range(3):
            train_step()
            prog.poll()
        assert prog._forward_handle is None  # steady state: the global forward hook is not registered
        words = read_monitor(mon).header
        assert words.progress_word(wire.P_OPTIMIZER_STEPS) == 3 and words.progress_word(wire.P_BACKWARDS) == 3
        # rank 0 evaluates alone: the step in progress runs long, the hook arms, eval forwards run
        clock.ns += 2 * S
        prog.poll()
        assert prog._forward_handle is not None
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                model(torch.ones(2, 4))
        clock.ns += S // 2
        prog.poll()
        assert mon.recorder._phase == Phase.EVAL
        # a checkpoint inside it nests its own phase (zero-code's torch.save phase checks only_auto_open)
        assert prog.only_auto_open()
        with torch.no_grad():
            model(torch.ones(2, 4))
        clock.ns += S // 2
        prog.poll()
        assert mon.recorder._phase == Phase.EVAL  # still working alone
        # then nothing moves (a spin after the evaluation): the phase closes after stale_s (2 s)
        clock.ns += S
        prog.poll()
        assert mon.recorder._phase == Phase.EVAL
        clock.ns += S + 1
        prog.poll()
        assert mon.recorder._phase == Phase.TRAIN
        header = read_monitor(mon).header
        assert header.progress_word(wire.P_AUTO_PHASE) == 0 and header.progress_word(wire.P_AUTO_COUNT) == 1
        assert header.progress_word(wire.P_EVAL_FORWARDS) == 4 * 4  # 4 module calls a forward: Sequential, 3 layers
        assert phases(mon) == [(Phase.EVAL, Phase.TRAIN), (Phase.TRAIN, Phase.EVAL)]


def test_an_evaluation_ends_with_the_next_step_and_that_step_is_marked_eval(tmp_path):
    clock = Clock()
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with installed(tmp_path, clock=clock, heartbeat_interval_s=3600, patch_collectives=False) as mon:
        prog = mon.progress
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        clock.ns += S // 10
        mon.step()
        prog.poll()
        clock.ns += 2 * S
        prog.poll()  # armed
        model.eval()
        with torch.no_grad():
            model(torch.ones(1, 4))
        clock.ns += S // 2
        prog.poll()
        assert mon.recorder._phase == Phase.EVAL
        model.train()
        model(torch.ones(1, 4)).sum().backward()  # back to training: the phase holds until the step ends
        clock.ns += S // 2
        prog.poll()
        assert mon.recorder._phase == Phase.EVAL
        opt.step()
        mon.step()
        prog.poll()
        assert mon.recorder._phase == Phase.TRAIN
        assert prog._forward_handle is None  # disarmed with the step
        steps = records_of(read_monitor(mon), RecordKind.STEP_END)
        assert [r.payload[wire.R_F - wire.R_A] for r in steps] == [Phase.TRAIN, Phase.EVAL]


def test_ranks_evaluating_together_open_the_phase_once_a_step(tmp_path):
    clock = Clock()
    model = nn.Linear(4, 1)
    with installed(tmp_path, clock=clock, heartbeat_interval_s=3600, patch_collectives=False) as mon:
        prog, marks = mon.progress, mon.recorder.collectives
        mon.step()
        prog.poll()
        clock.ns += 2 * S
        prog.poll()
        model.eval()
        for _ in range(3):  # eval forwards, then the metrics' all-reduce, every batch
            with torch.no_grad():
                model(torch.ones(1, 4))
            clock.ns += S // 2
            prog.poll()
            with mon.collective("all_reduce"):
                pass
            clock.ns += S // 2
            prog.poll()
        opened = [r for r in records_of(read_monitor(mon), RecordKind.PHASE) if r.payload[0] == Phase.EVAL]
        assert len(opened) == 1 and mon.recorder._phase == Phase.TRAIN and marks.current.seq == 3


def test_a_second_evaluation_right_after_the_first_is_an_eval_phase_too(tmp_path):
    """Fast steps: the first evaluation's phase closes a beat late, steps after it;
    the next evaluation (in the step the beat saw) opens the phase again."""
    clock = Clock()
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with installed(tmp_path, clock=clock, heartbeat_interval_s=3600, patch_collectives=False) as mon:
        prog = mon.progress

        def train_step():
            model.train()
            model(torch.ones(1, 4)).sum().backward()
            with mon.collective("all_reduce"):
                pass
            opt.step()
            clock.ns += S // 100
            mon.step()

        def evaluate():
            clock.ns += 2 * S
            prog.poll()  # armed
            model.eval()
            with torch.no_grad():
                model(torch.ones(1, 4))
            clock.ns += S // 2
            prog.poll()
            assert mon.recorder._phase == Phase.EVAL

        train_step()
        prog.poll()
        evaluate()
        for _ in range(8):  # back to training: eight steps and their all-reduces within one beat
            train_step()
        evaluate()  # the next evaluation, in the step the closing beat sees
        opened = [r.step for r in records_of(read_monitor(mon), RecordKind.PHASE) if r.payload[0] == Phase.EVAL]
        assert opened == [1, 9]
        assert mon.errors == 0


def test_an_explicit_phase_wins(tmp_path):
    clock = Clock()
    model = nn.Linear(4, 1)
    with installed(tmp_path, clock=clock, heartbeat_interval_s=3600, patch_collectives=False) as mon:
        prog = mon.progress
        mon.step()
        prog.poll()
        clock.ns += 2 * S
        prog.poll()
        with mon.phase("checkpoint"), torch.no_grad():
            model(torch.ones(1, 4))
            clock.ns += S // 2
            prog.poll()
            assert mon.recorder._phase == Phase.CHECKPOINT
        assert phases(mon) == [(Phase.CHECKPOINT, Phase.TRAIN), (Phase.TRAIN, Phase.CHECKPOINT)]


def test_progress_off_registers_nothing(tmp_path):
    from torch.nn.modules.module import _global_forward_pre_hooks

    before = torch.autograd.backward
    with installed(tmp_path, progress=False, patch_collectives=False) as mon:
        assert mon.progress is None and torch.autograd.backward is before
    assert not _global_forward_pre_hooks
