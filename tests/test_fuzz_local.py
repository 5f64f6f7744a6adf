"""Property tests for what a local attacker controls (issue #14), in the manner of
the report fuzzing in test_coord_api.py:

* slot files: the agent's reader on arbitrary bytes, truncations and mutations
  of a real slot raises nothing but SlotError, never blocks, and the tracker and
  report builder turn whatever they hold into a report the coordinator accepts
  (a bad rank is dropped, never the host's report);
* signed commands: the agent's command handler on arbitrary values and on
  mutated signed commands never raises and never acts on an invalid one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tempfile
import threading
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from watchdog.agent.command_channel.handlers import Actions, ack
from watchdog.agent.command_channel.inbox import CommandHandler
from watchdog.agent.command_channel.outbox import Outbox
from watchdog.agent.reporting import build as agent_report
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.contracts import commands as c
from watchdog.contracts import slot as wire
from watchdog.coordinator.intake.api import validate
from watchdog.hook import testing
from watchdog.report import HostReport, split_valid

# -- slot files ----------------------------------------------------------------------


def _real_slot() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        ident = wire.Identity(job="job", host="h", rank=1, local_rank=1, world_size=4, pid=os.getpid(), proc_start_us=1)
        wr = testing.RankSlot(d, ident, ring_capacity=8)
        for i in range(12):
            wr.step(1_000_000 * (i + 1), 1000, 2000)
        with open(wr.path, "rb") as fh:
            data = fh.read()
        wr.close()
        return data


REAL = _real_slot()
word = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
mutation = st.lists(st.tuples(st.integers(0, len(REAL) // 8 - 1), word), max_size=12)
slot_bytes = st.one_of(
    st.binary(max_size=2048),
    st.integers(0, len(REAL)).map(lambda n: REAL[:n]),
    mutation.map(lambda muts: _mutate(REAL, muts)),
    st.tuples(mutation, st.integers(0, len(REAL))).map(lambda mt: _mutate(REAL, mt[0])[: mt[1]]),
)


def _mutate(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for i, v in muts:
        b[i * 8 : i * 8 + 8] = v.to_bytes(8, "little", signed=True)
    return bytes(b)


def _read_within(path: str, seconds: float = 10.0):
    out: list = []

    def run():
        try:
            out.append(wire.read_slot(path))
        except wire.SlotError as exc:
            out.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), "read_slot blocked"
    return out[0]  # anything but SlotError was raised on the thread and left out empty: IndexError here


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=slot_bytes)
def test_slot_reader_and_tracker_never_raise_and_the_report_is_accepted(data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "job.rank1.pid1.slot")
        with open(path, "wb") as fh:
            fh.write(data)
        got = _read_within(path)
        assert isinstance(got, (wire.SlotSnapshot, wire.SlotError))
        t = SlotTracker(d)
        now = time.monotonic_ns()
        t.poll(now, time.time_ns())
        t.poll(now + 100_000_000, time.time_ns())
        assert not t._crashed  # a per-slot exception would have been caught and logged there
        for job in agent_report.jobs(t.views()):
            rep = agent_report.build_report(job, "h", "a1", 1, t.views(), now, time.time(), 1.0)
            ranks, _dropped = split_valid(rep.ranks)
            obj = json.loads(json.dumps(dataclasses.replace(rep, ranks=ranks).to_dict(), allow_nan=False))
            validate(HostReport.from_dict(obj))  # what survives the agent's check, the coordinator takes


# -- signed commands --------------------------------------------------------------------

TOKEN = "a-job-token-of-more-than-16-bytes"
NOW = 1_800_000_000.0


class RecordingActions(Actions):  # the handler's actions, recorded instead of run
    def __init__(self):
        self.ran: list[dict] = []

    def run(self, cmd):
        self.ran.append(copy.deepcopy(cmd))
        return ack(cmd, True), []


def _signed(kind: str, i: int) -> dict:
    tgt = c.target(1, 4242, 7_000_000)
    by_kind: dict[str, dict] = {
        c.SIGNAL: {"signal": "SIGTERM"},
        c.CHECKPOINT: {"step": 10, "ranks": [tgt]},
        c.ROLLBACK: {"before_step": 10, "action": "a-1"},
    }
    args = by_kind.get(kind, {"ranks": [tgt]})
    return c.sign(
        c.make(
            job="job",
            type=kind,
            host="node-a",
            args=args,
            issued_wall=NOW,
            ttl_s=30,
            target=tgt if kind == c.SIGNAL else None,
            id=f"c-{i:016x}",
        ),
        TOKEN,
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=16),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=5),
    max_leaves=20,
)
PATHS = [
    ("id",),
    ("job",),
    ("type",),
    ("host",),
    ("target",),
    ("target", "pid"),
    ("target", "proc_start_us"),
    ("target", "rank"),
    ("args",),
    ("args", "signal"),
    ("args", "ranks"),
    ("args", "step"),
    ("args", "before_step"),
    ("issued_wall",),
    ("expires_wall",),
    ("sig",),
]


def _set(cmd: dict, path: tuple, value) -> bool:
    cur = cmd
    for key in path[:-1]:
        if not isinstance(cur, dict) or not isinstance(cur.get(key), dict):
            return False
        cur = cur[key]
    if path[-1] in cur and cur[path[-1]] == value and type(cur[path[-1]]) is type(value):
        return False  # not a change
    cur[path[-1]] = value
    return True


def _handler():
    acts = RecordingActions()
    clock = [NOW - 1]  # the agent started before the commands were issued
    h = CommandHandler(host="node-a", token=TOKEN, loopback=False, actions=acts, outbox=Outbox(), wall=lambda: clock[0])
    clock[0] = NOW + 1
    return h, acts


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(c.TYPES), path=st.sampled_from(PATHS), value=json_values, n=st.integers(0, 1 << 30))
def test_a_mutated_signed_command_is_never_acted_on(kind, path, value, n):
    h, acts = _handler()
    cmd = _signed(kind, n)
    changed = _set(cmd, path, value)
    h("job", [cmd])
    assert h.wait_idle(10.0)
    if changed:
        assert acts.ran == [], f"acted on a command whose {path} was changed after signing"
    else:
        assert len(acts.ran) == 1
    h.stop()


@settings(max_examples=300, deadline=None)
@given(cmds=st.lists(json_values, max_size=6))
def test_arbitrary_values_as_commands_never_raise_and_never_act(cmds):
    h, acts = _handler()
    h("job", cmds)
    assert h.wait_idle(10.0) and acts.ran == []
    h.stop()


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(c.TYPES), token=st.text(min_size=1, max_size=40), n=st.integers(0, 1 << 30))
def test_a_command_signed_with_another_token_is_never_acted_on(kind, token, n):
    h, acts = _handler()
    cmd = c.sign({k: v for k, v in _signed(kind, n).items() if k != "sig"}, token)
    h("job", [cmd])
    assert h.wait_idle(10.0)
    assert (acts.ran != []) == (token == TOKEN)
    h.stop()
