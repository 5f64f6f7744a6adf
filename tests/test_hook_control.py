"""The way back (agent -> hook control block) and the heartbeat thread.

Most tests call the monitor's poll directly (what the heartbeat thread does each
interval) so they need no waiting; the last ones prove the real thread does it.
"""

from __future__ import annotations

import threading
import time

import pytest
from waiting import wait_for

from watchdog.contracts import control_block
from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Command, Phase, RecordKind
from watchdog.hook.marks import recorder as recorder_mod
from watchdog.hook.slot import control_block as control
from watchdog.hook.slot.heartbeat import THREAD_NAME
from watchdog.hook.testing import ENV_VARS, FakeClock, installed, read_monitor, records_of


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def mon(tmp_path):
    # A heartbeat that never comes round again: the test drives the polling.
    with installed(tmp_path, clock=FakeClock(), patch_collectives=False, heartbeat_interval_s=3600) as m:
        yield m


def ack(mon) -> tuple[int, int, int]:
    h = read_monitor(mon).header
    return h[wire.H_CTRL_ACK_SEQ], h[wire.H_CTRL_ACK_RESULT], h[wire.H_CTRL_ACK_STEP]


def test_checkpoint_at_step_runs_after_that_step(mon):
    calls = []

    def save(step):
        calls.append((step, read_monitor(mon).header[wire.H_PHASE]))

    mon.register_checkpoint(save)
    wire.write_control(mon.slot_path, 1, Command.CHECKPOINT_AT_STEP, 3)
    mon.control.poll()
    mon.step()
    mon.step()
    assert calls == [] and ack(mon)[0] == 0
    mon.step()
    assert calls == [(3, Phase.CHECKPOINT)]  # after step 3, inside the checkpoint phase
    assert ack(mon) == (1, control.ACK_OK, 3)
    (rec,) = records_of(read_monitor(mon), RecordKind.CONTROL)
    assert rec.payload[:3] == (1, Command.CHECKPOINT_AT_STEP, control.ACK_OK)
    mon.step()
    mon.control.poll()  # same seq: nothing new
    assert len(calls) == 1
    assert mon.stats()["ctrl_done"] == 1


def test_a_step_already_past_acts_at_the_next_boundary(mon):
    calls: list[int] = []
    mon.register_checkpoint(calls.append)
    for _ in range(5):
        mon.step()
    wire.write_control(mon.slot_path, 9, Command.CHECKPOINT_AT_STEP, 2)
    mon.control.poll()
    mon.step()
    assert calls == [6] and ack(mon) == (9, control.ACK_OK, 6)


def test_raising_save_function_is_reported_not_raised(mon, caplog):
    def save(step):
        raise OSError("disk full")

    mon.register_checkpoint(save)
    wire.write_control(mon.slot_path, 2, Command.CHECKPOINT_AT_STEP, 1)
    mon.control.poll()
    mon.step()  # must not raise
    assert ack(mon) == (2, control.ACK_SAVE_FAILED, 1)
    assert mon.stats()["save_failures"] == 1
    assert "disk full" in caplog.text
    assert read_monitor(mon).header[wire.H_PHASE] == Phase.TRAIN
    mon.step()
    assert read_monitor(mon).header[wire.H_STEP] == 2


def test_no_registered_function_is_acknowledged_as_such(mon):
    wire.write_control(mon.slot_path, 3, Command.CHECKPOINT_AT_STEP, 0)
    mon.control.poll()
    mon.step()
    assert ack(mon) == (3, control.ACK_NO_HANDLER, 1)


@pytest.mark.parametrize(
    "command, arg", [(99, 1), (-5, 1), (Command.CHECKPOINT_AT_STEP, -1), (Command.CHECKPOINT_AT_STEP, 2**62)]
)
def test_invalid_requests_are_rejected_counted_and_ignored(mon, command, arg):
    calls: list[int] = []
    mon.register_checkpoint(calls.append)
    wire.write_control(mon.slot_path, 4, command, arg)
    mon.control.poll()
    assert ack(mon) == (4, control.ACK_REJECTED, 0)
    for _ in range(3):
        mon.step()
    assert calls == []
    assert mon.stats()["ctrl_rejected"] == 1
    assert mon.errors == 0  # a bad request is the agent's problem, not a hook failure


def test_a_new_request_supersedes_the_pending_one(mon):
    calls: list[int] = []
    mon.register_checkpoint(calls.append)
    wire.write_control(mon.slot_path, 1, Command.CHECKPOINT_AT_STEP, 2)
    mon.control.poll()
    wire.write_control(mon.slot_path, 2, Command.NONE, 0)  # cancel
    mon.control.poll()
    assert ack(mon) == (2, control.ACK_OK, 0)
    for _ in range(4):
        mon.step()
    assert calls == []


def test_half_written_request_waits_for_the_next_poll():
    class Words(dict):
        """CTRL_SEQ changes between the two reads of one poll."""

        def __getitem__(self, i):
            value = dict.__getitem__(self, i)
            if i == wire.H_CTRL_SEQ:
                self[i] = value + 1
            return value

    words = Words({wire.H_CTRL_SEQ: 5, wire.H_CTRL_CMD: 1, wire.H_CTRL_ARG: 7})
    assert control_block.read_request(words, last_seen=0) is None
    steady = {wire.H_CTRL_SEQ: 5, wire.H_CTRL_CMD: 1, wire.H_CTRL_ARG: 7}
    assert control_block.read_request(steady, 0) == control_block.ControlRequest(5, 1, 7)
    assert control_block.read_request(steady, 5) is None


def test_checking_for_requests_costs_the_step_one_comparison(mon, monkeypatch):
    """No request pending: step() must not touch the control words at all."""
    reads = []
    real = mon.slot._words

    class Spy:
        def __getitem__(self, i):
            reads.append(i)
            return real[i]

        def __setitem__(self, i, v):
            real[i] = v

    def packs_into_the_real_words(pack):
        return lambda buf, offset, *values: pack(real, offset, *values)

    monkeypatch.setattr(mon.slot, "_words", Spy())
    monkeypatch.setattr(recorder_mod, "_pack_step", packs_into_the_real_words(recorder_mod._pack_step))
    monkeypatch.setattr(recorder_mod, "pack_record", packs_into_the_real_words(recorder_mod.pack_record))
    for _ in range(10):
        mon.step()
    assert reads == []
    assert mon.errors == 0 and read_monitor(mon).header[wire.H_STEP] == 10


def test_register_checkpoint_rejects_non_callables(mon):
    with pytest.raises(ValueError, match="not callable"):
        mon.register_checkpoint(42)


def test_heartbeat_thread_beats_and_stops_at_close(tmp_path):
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=0.02) as mon:
        (thread,) = [t for t in threading.enumerate() if t.name == THREAD_NAME]
        assert thread.daemon
        first = read_monitor(mon).header
        wait_for(lambda: read_monitor(mon).header[wire.H_HEARTBEAT_COUNT] >= first[wire.H_HEARTBEAT_COUNT] + 3,
                 what="three more heartbeats")  # fmt: skip
        later = read_monitor(mon).header
        assert later.heartbeat_ns > first.heartbeat_ns
        assert abs(later.heartbeat_ns - time.monotonic_ns()) < 5e9  # same clock the agent uses
    thread.join(5)
    assert not thread.is_alive()


def test_heartbeat_thread_picks_up_a_request(tmp_path):
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=0.02) as mon:
        calls: list[int] = []
        mon.register_checkpoint(calls.append)
        wire.write_control(mon.slot_path, 1, Command.CHECKPOINT_AT_STEP, 0)

        def stepped_and_acked():
            mon.step()
            return ack(mon)[0] == 1

        wait_for(stepped_and_acked, what="the checkpoint request to be acted on")
        assert len(calls) == 1
