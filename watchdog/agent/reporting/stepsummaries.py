"""The agent's half of the step summaries (``watchdog.contracts.stepsummary``): per rank
incarnation, the statistics of the step samples the coordinator accepted from
this agent, and each report's ranks with the statistics after their new samples.

The coordinator's reply says under which settings to compute them
(``"step_summary_config"``); until one does (an older coordinator, or none has
answered yet) reports carry none. When a reply brings settings new to the agent
(its first reply, or a coordinator restarted with other settings), the ranks
start over from the samples of the report it answered: what that coordinator,
if it started with them, folded first. A rank's statistics move on only once
the report carrying its samples is accepted, as the samples themselves are
marked reported (``sender.py``): a failed report's samples come again in the
next one and are summarised again then, so the agent folds exactly the samples
the coordinator folds, in the same order, with the same code
(``stepstats.steps.add_samples``).

Costs the agent ~35 us of CPU a rank a report (8 ranks, ~4 samples each: ~0.3
ms a second), and saves the coordinator ~15 us a rank (in process at 16,384
ranks, on the one core that takes 16,384 of them a second)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from watchdog.contracts import stepsummary
from watchdog.report import HostReport, StepSample
from watchdog.stepstats.steps import StepStats, add_samples, summary_of

Key = tuple[str, int, int, int]  # (job, rank, pid, process start): one incarnation of one rank
_EMPTY = StepStats()


def reply_config(reply: Any) -> tuple[int, ...]:
    """The settings a coordinator's reply gives; () when it gives none or they are malformed."""
    val = reply.get("step_summary_config") if isinstance(reply, dict) else None
    return tuple(val) if val is not None and not stepsummary.config_problem(val) else ()


class StepSummaries:
    """Used by one sender thread: ``add`` a report's summaries, then ``accepted``
    or ``failed`` once its fate is known."""

    def __init__(self) -> None:
        self.config: tuple[int, ...] = ()  # the settings of the last reply; () = send none
        self._cfg: stepsummary.SummarySettings | None = None
        self._kept: dict[Key, StepStats] = {}  # the samples accepted so far, summarised
        self._pending: dict[Key, StepStats] = {}  # the same after the report in flight
        self._sent: dict[Key, tuple[StepSample, ...]] = {}  # the report in flight's samples
        self.omitted = 0  # summaries left out as out of range (see ``summary``)

    def add(self, rep: HostReport) -> HostReport:
        """``rep`` with each rank's step summary, under the settings of the last reply."""
        self.begin()
        ranks = []
        for r in rep.ranks:
            summary = self.summary((rep.job, r.rank, r.pid, r.proc_start_us), r.recent_steps)
            ranks.append(replace(r, step_summary=summary) if summary else r)
        return replace(rep, ranks=tuple(ranks), step_summary_config=self.config) if self.config else rep

    def begin(self) -> None:
        """A new report: what ``summary`` notes is its."""
        self._pending, self._sent = {}, {}

    def summary(self, key: Key, samples: tuple[StepSample, ...]) -> tuple[float, ...]:
        """The summary of rank incarnation ``key`` once the report being built, carrying its
        new ``samples``, is accepted; () when there is none to send (no settings yet, or
        nothing kept yet: the rank's warm-up)."""
        self._sent[key] = samples
        cfg = self._cfg
        if cfg is None:
            return ()
        before = self._kept.get(key, _EMPTY)
        if not samples:  # kept as it is; the coordinator reads no summary without new samples
            self._pending[key] = before
            return ()
        after = self._pending[key] = add_samples(before, samples, cfg)
        if not after.history:
            return ()
        summary = summary_of(after, before)
        # Out of range only for samples no hook writes (a step of ~0 s with a data wait): the
        # coordinator would drop the rank for it, so it computes that rank's statistics itself.
        if stepsummary.problem(summary):
            self.omitted += 1
            return ()
        return summary

    def accepted(self, job: str, reply: Any) -> None:
        """The report ``add`` made for ``job`` was accepted with ``reply``. Ranks of the
        job that it did not carry are forgotten (exited, replaced, or dropped as invalid)."""
        config = reply_config(reply)
        if config != self.config:  # the first settings, or other ones: every rank starts over
            self.config = config
            cfg = self._cfg = stepsummary.SummarySettings(*config) if config else None
            self._kept = {k: add_samples(_EMPTY, s, cfg) for k, s in self._sent.items() if s} if cfg else {}
        else:
            kept = {k: v for k, v in self._kept.items() if k[0] != job}
            kept.update(self._pending)
            self._kept = kept
        self._pending, self._sent = {}, {}

    def failed(self) -> None:
        """The report was not accepted: its samples come again in the next one."""
        self._pending, self._sent = {}, {}
