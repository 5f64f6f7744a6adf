"""The opt-in forward/backward/optimizer split: real torch hooks on a small
model, a fake clock so the numbers are exact; misuse fails at watch time; a
failing hook stops timing and never raises into training."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")

import torch

from watchdog.hook.marks.model_split import ModelSplit
from watchdog.hook.noop import NULL_MONITOR


def _train(split_model, opt, steps=3):
    for _ in range(steps):
        loss = split_model(torch.ones(2, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_forward_backward_optimizer_per_step():
    ticks = itertools.count()
    clock = lambda: next(ticks) * 1_000_000_000  # noqa: E731 - each read advances one second
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


# -- through the slot: what the agent reads ------------------------------------------

from watchdog.contracts import slot as wire  # noqa: E402
from watchdog.hook.testing import FakeClock, installed, read_monitor, step_splits  # noqa: E402


class _Ticking(torch.nn.Module):
    """Forward advances the fake clock, so each part's time is exact."""

    def __init__(self, clock, ns):
        super().__init__()
        self.lin, self.clock, self.ns = torch.nn.Linear(4, 1), clock, ns

    def forward(self, x):
        self.clock.advance(self.ns)
        return self.lin(x)


def test_split_bytes_and_batch_reach_the_slot(tmp_path):
    """watch_model's forward/backward/optimizer, the loader's device copy (h2d),
    every collective's bytes and the per-rank batch: in each step's record and
    in the header's running totals."""
    clock = FakeClock(10_000)
    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        model = _Ticking(clock, 1000)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch_model(model, opt)
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(6, 4)), batch_size=3)
        for (x,) in mon.wrap_loader(data, device="cpu"):
            loss = model(x).sum()
            clock.advance(400)  # backward
            loss.backward()
            with mon.collective("all_reduce", nbytes=4096):
                clock.advance(100)
            with mon.collective("all_reduce", nbytes=1024):
                pass
            opt.step()
            clock.advance(0)
            mon.step()
        snap = read_monitor(mon)
    splits = step_splits(snap)
    assert len(splits) == 2
    for s in splits:
        assert s.coll_bytes == 5120  # every collective of the step, not the last one
        assert (s.forward_ns, s.backward_ns, s.optimizer_ns) == (1000, 500, 0)
        assert s.h2d_ns == 0  # on CPU .to("cpu") is the tensor itself: ~0, a fake clock says exactly 0
    h = snap.header
    assert h[wire.H_TOTAL_COLL_BYTES] == 10240
    assert [h[w] for w in wire.SPLIT_WORDS] == [2000, 1000, 0, 0]
    assert h[wire.H_BATCH_PER_RANK] == 3  # the DataLoader's batch_size


def test_batch_size_read_off_the_first_batch_or_set(tmp_path):
    clock = FakeClock(10_000)
    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        batches = [{"x": torch.ones(5, 2), "y": torch.ones(5)}, {"x": torch.ones(2, 2), "y": torch.ones(2)}]
        assert [b["x"].shape[0] for b in mon.wrap_loader(batches)] == [5, 2]
        assert read_monitor(mon).header[wire.H_BATCH_PER_RANK] == 5  # sized once: the short last batch is not it
        mon.set_batch_size(16)
        assert read_monitor(mon).header[wire.H_BATCH_PER_RANK] == 16
        with pytest.raises(ValueError, match="set_batch_size"):
            mon.set_batch_size(0)
        with pytest.raises(ValueError, match="not a torch device"):
            mon.wrap_loader(batches, device="no-such-device")


def test_device_copy_is_timed_and_moves_every_tensor(tmp_path):
    clock = FakeClock(10_000)

    class Slow(torch.Tensor):  # a .to that takes 700 ns on the fake clock
        def to(self, *a, **k):
            clock.advance(700)
            return torch.Tensor.to(self, *a, **k)

    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        batch = (torch.ones(2).as_subclass(Slow), [torch.zeros(2).as_subclass(Slow)], "label")
        for got in mon.wrap_loader([batch], device="cpu"):
            assert got[2] == "label" and isinstance(got[1], list)
            mon.step()
        [s] = step_splits(read_monitor(mon))
    assert s.h2d_ns == 1400


def test_disabled_monitor_still_moves_batches():
    """With the hook off, wrap_loader(device=) must still deliver batches on the device."""
    out = list(NULL_MONITOR.wrap_loader([(torch.ones(1),)], device="cpu"))
    assert isinstance(out[0], tuple) and out[0][0].device.type == "cpu"
