"""Host-level families about the agent itself: slot files by state, read errors,
polls, reports, its own CPU and memory, build info."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import psutil
from prometheus_client.core import Metric

from watchdog.agent.command_channel.inbox import RESULTS
from watchdog.agent.export import metrics as m
from watchdog.agent.slotfiles.tracker import READ_ERROR_REASONS, SlotTracker
from watchdog.cli import package_version
from watchdog.contracts.commands import REFUSALS, TYPES


@dataclass
class LoopStats:
    """Written by the poll loop, read by scrapes (plain attribute stores)."""

    last_poll_s: float = 0.0


class AgentCollector:
    name = "agent"

    def __init__(
        self, tracker: SlotTracker, loop: LoopStats, sender: Any = None, self_proc: Any = None, commands: Any = None
    ) -> None:
        self._tracker, self._loop, self._sender, self._commands = tracker, loop, sender, commands
        self._self = self_proc or psutil.Process()
        self._version = package_version()

    def collect(self) -> list[Metric]:
        t = self._tracker
        errors, slots = m.SLOT_READ_ERRORS.family(), m.SLOTS.family()
        for reason in READ_ERROR_REASONS:
            errors.add_metric([reason], t.read_errors.get(reason, 0))
        for state, n in t.state_counts().items():
            slots.add_metric([state], n)
        polls, poll_s, proc_err = m.POLLS.family(), m.POLL_DURATION.family(), m.PROC_ERRORS.family()
        polls.add_metric([], t.polls)
        poll_s.add_metric([], self._loop.last_poll_s)
        proc_err.add_metric([], t.procs.errors)
        reports, commands = m.REPORTS.family(), m.COMMANDS.family()
        s = self._sender
        reports.add_metric(["ok"], s.ok if s else 0)
        reports.add_metric(["error"], s.failed if s else 0)
        commands.add_metric([], s.commands_received if s else 0)
        dropped = m.REPORT_RANKS_DROPPED.family()
        dropped.add_metric([], getattr(s, "ranks_dropped", 0) if s else 0)
        unaddressed = m.REPORTS_UNADDRESSED.family()
        unaddressed.add_metric([], getattr(s, "reports_unaddressed", 0) if s else 0)
        omitted = m.STEP_SUMMARIES_OMITTED.family()
        summaries = getattr(s, "summaries", None)
        omitted.add_metric([], summaries.omitted if summaries is not None else 0)
        refused, executed = m.COMMANDS_REFUSED.family(), m.COMMANDS_EXECUTED.family()
        h = self._commands
        for reason in REFUSALS:  # every reason from the start: a zero is a zero, not a missing series
            refused.add_metric([reason], h.refused.get(reason, 0) if h else 0)
        for kind in TYPES:
            for result in RESULTS:
                executed.add_metric([kind, result], h.executed.get((kind, result), 0) if h else 0)
        cpu, rss, info = m.AGENT_CPU.family(), m.AGENT_RSS.family(), m.BUILD_INFO.family()
        with self._self.oneshot():
            ct = self._self.cpu_times()
            cpu.add_metric([], ct.user + ct.system)
            rss.add_metric([], self._self.memory_info().rss)
        info.add_metric([self._version, platform.python_version()], 1.0)
        return [
            errors,
            slots,
            polls,
            poll_s,
            proc_err,
            reports,
            dropped,
            unaddressed,
            omitted,
            commands,
            refused,
            executed,
            cpu,
            rss,
            info,
        ]
