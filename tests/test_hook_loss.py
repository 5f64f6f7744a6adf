"""mon.step(loss=...): the loss words in the slot, as the agent reads and reports them."""

from __future__ import annotations

import math

import pytest

from watchdog.agent.reporting.build import _loss
from watchdog.contracts import slot as wire
from watchdog.hook.noop import NULL_MONITOR
from watchdog.hook.testing import ENV_VARS, FakeClock, installed, read_monitor


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def test_step_with_loss_stores_it_for_the_step_it_ends(tmp_path):
    with installed(tmp_path, clock=FakeClock(), patch_collectives=False, heartbeat_interval_s=3600) as mon:
        mon.step()
        assert read_monitor(mon).header.loss is None  # no loss given: none reported, not 0.0
        mon.step(loss=2.5)
        h = read_monitor(mon).header
        assert (h.loss, h[wire.H_LOSS_STEP], h[wire.H_STEP], h[wire.H_LOSS_BAD_STEP]) == (2.5, 2, 2, 0)
        assert _loss(h) == {"loss": 2.5, "loss_finite": True, "loss_step": 2, "loss_bad_step": 0, "loss_bad_count": 0}


def test_a_nan_loss_is_remembered_after_finite_ones(tmp_path):
    with installed(tmp_path, clock=FakeClock(), patch_collectives=False, heartbeat_interval_s=3600) as mon:
        mon.step(loss=1.0)
        mon.step(loss=float("nan"))
        mon.step(loss=float("inf"))
        mon.step(loss=0.9)  # a finite loss later does not hide the NaN the agent may not have seen
        h = read_monitor(mon).header
        assert (h.loss, h[wire.H_LOSS_BAD_STEP], h[wire.H_LOSS_BAD_COUNT]) == (0.9, 2, 2)
        mon.step(loss=float("nan"))
        rep = _loss(read_monitor(mon).header)
        assert rep["loss_finite"] is False and rep["loss"] == 0.0 and rep["loss_step"] == 5
        loss = read_monitor(mon).header.loss
        assert loss is not None and math.isnan(loss)


def test_a_loss_that_is_not_a_number_is_ignored_never_raised(tmp_path):
    class GpuTensor:  # float() of a CUDA tensor would synchronise the device
        def __float__(self):
            raise AssertionError("must not be called")

    with installed(tmp_path, clock=FakeClock(), patch_collectives=False, heartbeat_interval_s=3600) as mon:
        mon.step(loss=GpuTensor())
        mon.step(loss=3)
        h = read_monitor(mon).header
        assert (h[wire.H_STEP], h.loss, mon.errors) == (2, 3.0, 0)
        assert mon.recorder.loss_ignored == 1
    NULL_MONITOR.step(loss=1.0)
    mon.step(loss=1.0)  # closed: a no-op that still takes the argument
