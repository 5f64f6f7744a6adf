"""Test doubles for the agent, shipped for users' tests too: a slot writer that
speaks wire.py (a stand-in for the hook), a psutil-like process with scripted
failures, and a fake ``pynvml`` module."""

from watchdog.agent.fakes.nvml import FakeNvml
from watchdog.agent.fakes.process import FakeProcess, FakeProcesses
from watchdog.agent.fakes.slotwriter import SlotWriter, identity, snapshot, step_record

__all__ = ["FakeNvml", "FakeProcess", "FakeProcesses", "SlotWriter", "identity", "snapshot", "step_record"]
