"""The opt-in forward/backward/optimizer split: real torch hooks on a small
model, a fake clock so the numbers are exact; misuse fails at watch time; a
failing hook stops timing and never raises into training."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from watchdog.hook.model_split import ModelSplit  # noqa: E402
from watchdog.hook.noop import NULL_MONITOR  # noqa: E402


def _train(split_model, opt, steps=3):
    for _ in range(steps):
        loss = split_model(torch.ones(2, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_forward_backward_optimizer_per_step():
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731 - each read advances one second
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    split = ModelSplit(clock).watch(model, opt)
    _train(model, opt)
    # Reads per step: forward pre, forward post, optimizer pre, optimizer post.
    assert split.means() == {"forward_s": 1.0, "backward_s": 1.0, "optimizer_s": 1.0, "steps": 3}
    split.close()
    _train(model, opt)
    assert split.steps == 3


def test_misuse_fails_at_watch_time():
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError, match=r"torch\.nn\.Module"):
        ModelSplit().watch(object(), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="Optimizer"):
        ModelSplit().watch(model, object())


def test_a_failing_clock_stops_timing_not_training():
    def bad():
        raise RuntimeError("clock gone")

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    split = ModelSplit(bad).watch(model, opt)
    _train(model, opt)
    assert split.errors == 1 and split.steps == 0


def test_disabled_monitor_gives_an_unattached_split():
    model = torch.nn.Linear(4, 1)
    split = NULL_MONITOR.watch_model(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert split.means()["steps"] == 0
