"""Where the training thread is during a long step (watchdog.hook.marks.frames): when
it is sampled, which frame is kept, the slot words it writes, and that the
sampler never raises into the heartbeat; then a real thread sampled in process."""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace

import pytest

from watchdog.contracts import slot as wire
from watchdog.hook.marks import frames
from watchdog.hook.marks.frames import FrameSampler, should_sample, user_frame

S = 1_000_000_000


@pytest.mark.parametrize(
    ("steps", "age_s", "last_s", "in_coll", "sampled"),
    [
        (5, 0.1, 0.1, False, False),  # a normal step
        (5, 0.2, 0.05, False, False),  # 4x the last, but under the floor: jitter, not a stall
        (5, 0.3, 0.1, False, True),  # a metrics upload, an evaluation, a save (or a hang)
        (5, 3.0, 2.0, False, False),  # slow steps: 2x the last before sampling
        (5, 4.1, 2.0, False, True),
        (5, 9.0, 0.1, True, False),  # waiting in a collective or on its loader: where it waits holds nobody
        (0, 30.0, 0.0, False, False),  # before the first step ends
    ],
)
def test_a_frame_is_sampled_only_in_a_long_step_outside_collectives(steps, age_s, last_s, in_coll, sampled):
    assert should_sample(steps, int(age_s * S), int(last_s * S), in_coll) is sampled


def fake_stack(*frames_outer_first: tuple[str, str, int]):
    """A chain of frame-like objects, outermost first: (file, function, line); returns the innermost."""
    frame = None
    for path, name, line in frames_outer_first:
        frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=path, co_name=name), f_lineno=line, f_back=frame)
    return frame


LIBS = ("/usr/lib/python3.11/", "/venv/site-packages/")
TRAIN = "/work/job/train.py"


@pytest.mark.parametrize(
    ("stack", "want"),
    [
        # the script's innermost frame, under torch's internals
        (
            [
                (TRAIN, "<module>", 90),
                (TRAIN, "main", 70),
                (TRAIN, "estimate_loss", 41),
                ("/venv/site-packages/torch/nn/modules/module.py", "_call_impl", 1500),
                ("/work/job/model.py", "forward", 12),
                ("/venv/site-packages/torch/nn/functional.py", "linear", 10),
            ],
            "estimate_loss (train.py:41)",
        ),
        # a sleep or blocking upload in the script: C code has no frame
        ([(TRAIN, "<module>", 90), (TRAIN, "upload_metrics", 21)], "upload_metrics (train.py:21)"),
        # a library's loop (a Trainer) called from the script: the script's call into it
        (
            [(TRAIN, "<module>", 9), (TRAIN, "main", 5), ("/venv/site-packages/transformers/trainer.py", "train", 1)],
            "main (train.py:5)",
        ),
        # the script not on the stack (python -m pkg): the innermost frame outside the libraries
        (
            [
                ("/usr/lib/python3.11/runpy.py", "_run_module_as_main", 198),
                ("/work/job/pkg/loop.py", "run", 33),
                ("/work/job/pkg/metrics.py", "push", 8),
                ("/usr/lib/python3.11/socket.py", "recv", 5),
            ],
            "push (metrics.py:8)",
        ),
        # only library code, or generated code: nothing to say
        ([("/usr/lib/python3.11/threading.py", "wait", 3), ("<string>", "f", 1)], ""),
    ],
)
def test_the_frame_kept_is_the_scripts_innermost(stack, want):
    assert user_frame(fake_stack(*stack), TRAIN, LIBS, lambda p: p) == want


def test_a_deep_stack_is_walked_no_further_than_max_depth():
    deep = [(TRAIN, "main", 1)] + [("/work/job/lib.py", f"r{i}", i) for i in range(frames.MAX_DEPTH + 50)]
    # the script's frame is past the walk: the innermost frame outside the libraries is said
    assert (
        user_frame(fake_stack(*deep), TRAIN, LIBS, lambda p: p)
        == f"r{frames.MAX_DEPTH + 49} (lib.py:{frames.MAX_DEPTH + 49})"
    )


class FakeSlot:
    """The two things the sampler uses of a SlotWriter: its words, and put."""

    def __init__(self) -> None:
        self.words = [0] * (wire.RING_OFFSET // wire.WORD)

    def put(self, index: int, value: int) -> None:
        assert not wire.seqlocked(index) and wire.P_FRAME_STEP <= index < wire.P_FRAME_STEP + wire.FRAME_WORDS
        self.words[index] = value


def _long_step(slot: FakeSlot, now_ns: int, steps: int = 7) -> None:
    slot.words[wire.H_STEP] = steps
    slot.words[wire.H_LAST_STEP_NS] = S // 10
    slot.words[wire.H_STEP_START_NS] = now_ns - 2 * S


def test_the_sampler_writes_the_step_it_is_in_and_the_frame_a_reader_decodes():
    now = 50 * S
    slot = FakeSlot()
    ready, done = threading.Event(), threading.Event()

    def upload_metrics() -> None:  # this file is not __main__: the innermost frame outside the libraries
        ready.set()
        done.wait(10)

    worker = threading.Thread(target=upload_metrics)
    worker.start()
    try:
        assert ready.wait(10)
        sampler = FrameSampler(slot, lambda: now, thread_id=worker.ident)
        sampler.poll()  # not a long step yet: nothing
        assert slot.words[wire.P_FRAME_NS] == 0
        _long_step(slot, now)
        sampler.poll()
    finally:
        done.set()
        worker.join(10)
    got = wire.decode_frame(tuple(slot.words[wire.P_FRAME_STEP : wire.P_FRAME_STEP + wire.FRAME_WORDS]))
    assert got is not None
    step, t_ns, text = got
    assert (step, t_ns) == (8, now)  # steps completed + 1: the record this step will have
    assert text.startswith("upload_metrics (test_hook_frames.py:") and sampler.samples == 1


def test_a_rank_waiting_on_its_loader_is_not_sampled():
    slot = FakeSlot()
    _long_step(slot, 50 * S)
    slot.words[wire.H_DATA_ENTER_NS], slot.words[wire.H_DATA_EXIT_NS] = 49 * S, 48 * S  # in a data wait
    FrameSampler(slot, lambda: 50 * S, thread_id=threading.get_ident()).poll()
    assert slot.words[wire.P_FRAME_NS] == 0


def test_the_sampler_never_raises_and_stops_after_its_first_error():
    class Broken(FakeSlot):
        def put(self, index: int, value: int) -> None:
            raise OSError("slot gone")

    slot = Broken()
    _long_step(slot, 50 * S)
    sampler = FrameSampler(slot, lambda: 50 * S, thread_id=threading.get_ident())
    sampler.poll()
    sampler.poll()
    assert isinstance(sampler.failed, OSError) and sampler.samples == 0


def test_the_library_directories_hold_torch_and_this_package_not_the_tests():
    libs = frames.library_dirs()
    import torch

    assert os.path.realpath(torch.__file__).startswith(libs)
    assert os.path.realpath(frames.__file__).startswith(libs)
    assert not os.path.realpath(__file__).startswith(libs)
    assert sys.modules["__main__"] is not None  # main_file() reads it; "" when it has no file
    assert isinstance(frames.main_file(), str)


def test_the_script_is_found_when_main_gets_its_file_after_install(monkeypatch):
    """``watchdog run`` installs the hook from sitecustomize, before runpy sets
    ``__main__.__file__``: the sampler finds the script at its first sample."""
    fake_main = SimpleNamespace()
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    slot = FakeSlot()
    _long_step(slot, 50 * S)
    sampler = FrameSampler(slot, lambda: 50 * S, thread_id=threading.get_ident())
    fake_main.__file__ = __file__  # runpy, later
    sampler.poll()
    got = wire.decode_frame(tuple(slot.words[wire.P_FRAME_STEP : wire.P_FRAME_STEP + wire.FRAME_WORDS]))
    # this thread's innermost frame in "the script" (this file): the test itself, not pytest's
    assert got is not None and got[2].startswith("test_the_script_") and "~ (test_hook_frames.py:" in got[2], got
    assert len(got[2].encode()) <= wire.FRAME_TEXT_BYTES  # a long name is cut, the place kept
