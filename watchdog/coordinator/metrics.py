"""Every metric the coordinator exports, defined in one place (names are an API;
tests/golden/coordinator_metrics.txt pins them). The registry is injected so
tests can run several coordinators in one process.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from watchdog.cli import package_version
from watchdog.contracts.commands import TYPES as COMMAND_TYPES
from watchdog.report import MAX_ACKS_PER_REPORT

from ..contracts.finding import KINDS
from .host_culprits import NAME as HOST_CULPRITS
from .host_culprits import HostCulprits, Without
from .vocabularies import (
    ACTIONS,
    COMMAND_OUTCOMES,
    GOODPUT_CATEGORIES,
    SPLIT_CLOCKS,
    VERDICT_SHARES,
    VERDICTS,
    JobState,
)

# Gauges a detector hands out through its ``gauges(now, view)`` (see detectors/__init__.py),
# keyed by these names: the detector that computes the value says which gauge it is.
STRAGGLER_SCORE = "watchdog_coordinator_straggler_score"  # labelled by rank
HANG_SECONDS = "watchdog_coordinator_hang_seconds"
HANG_DEADLINE_SECONDS = "watchdog_coordinator_hang_deadline_seconds"
DETECTOR_GAUGES = {STRAGGLER_SCORE: True, HANG_SECONDS: False, HANG_DEADLINE_SECONDS: False}  # name -> labelled
# name -> value, or for a labelled gauge {label value: value} (the series to export now: others are removed).
GaugeValues = Mapping[str, float | Mapping[str, float]]

REJECT_REASONS = (
    "bad_json",
    "too_large",
    "no_length",
    "unauthorized",
    "version",
    "schema",
    "wrong_job",
    "timeout",
    "internal",
)
# What became of an action the policy started (control/action_metrics.py): started, then one of
# succeeded / failed; a dry run is counted as such and nothing else.
ACTION_OUTCOMES = ("started", "succeeded", "failed", "dry_run")
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class CoordinatorMetrics:
    def __init__(self, registry: CollectorRegistry, detectors: tuple[str, ...] = KINDS) -> None:
        r = registry
        # The training job is known only once the first report arrives, so it is a label of
        # this one series (joined on the scrape target by rules and dashboards), not of all.
        # Never `job`: that is the scrape job's label.
        self.info = Gauge(
            "watchdog_coordinator_info",
            "Always 1; labels identify the job this coordinator serves",
            ["training_job"],
            registry=r,
        )
        self.build_info = Gauge(
            "watchdog_coordinator_build_info",
            "Always 1; labels carry the coordinator's version",
            ["version", "python_version"],
            registry=r,
        )
        self.build_info.labels(package_version(), platform.python_version()).set(1)
        self.findings = Counter("watchdog_coordinator_findings_total", "Findings opened, by kind", ["kind"], registry=r)
        self.active = Gauge(
            "watchdog_coordinator_findings_active",
            "Findings whose condition currently holds, by kind",
            ["kind"],
            registry=r,
        )
        self.resolved = Counter(
            "watchdog_coordinator_findings_resolved_total",
            "Findings whose condition ended, by kind",
            ["kind"],
            registry=r,
        )
        self.ranks_expected = Gauge(
            "watchdog_coordinator_ranks_expected",
            "Ranks the job should have (configured world size, else the one its live ranks report)",
            registry=r,
        )
        self.ranks_registered = Gauge(
            "watchdog_coordinator_ranks_registered",
            "Ranks some agent has reported, less those of an earlier world after a resize (retired)",
            registry=r,
        )
        self.ranks_alive = Gauge(
            "watchdog_coordinator_ranks_alive",
            "Reported ranks whose process exists, not exited, host not lost",
            registry=r,
        )
        self.hosts = Gauge(
            "watchdog_coordinator_hosts",
            "Hosts seen, by state (reporting; unobserved: its agent silent, nothing against its ranks; lost)",
            ["state"],
            registry=r,
        )
        self.straggler = Gauge(
            STRAGGLER_SCORE, "Rank compute time over the median of the other ranks (1 = typical)", ["rank"], registry=r
        )
        self.hang = Gauge(
            HANG_SECONDS,
            "Seconds since any live rank completed a step or a collective, or since ranks entered the collective they still wait in; a hang when above the deadline",
            registry=r,
        )
        self.hang_deadline = Gauge(HANG_DEADLINE_SECONDS, "Current adaptive collective-hang deadline", registry=r)
        self.det_success = Gauge(
            "watchdog_detector_success", "1 if the detector's last run succeeded", ["detector"], registry=r
        )
        self.det_duration = Gauge(
            "watchdog_detector_duration_seconds", "Duration of the detector's last run", ["detector"], registry=r
        )
        self.det_errors = Counter(
            "watchdog_detector_errors_total", "Detector runs that raised", ["detector"], registry=r
        )
        self.received = Counter("watchdog_coordinator_reports_received_total", "Host reports accepted", registry=r)
        self.rejected = Counter(
            "watchdog_coordinator_reports_rejected_total", "Host reports refused, by reason", ["reason"], registry=r
        )
        self.reports_read = Counter(
            "watchdog_coordinator_reports_read_total",
            "Host report bodies read, by how: in one typed pass (one_pass: an agent's usual version-2 report) or "
            "by the checking path (checked: version 1, a rank to drop, anything odd or refused)",
            ["path"],
            registry=r,
        )
        self.ranks_dropped = Counter(
            "watchdog_coordinator_report_ranks_dropped_total",
            "Rank entries left out of accepted reports as invalid (the rest of the report is kept)",
            registry=r,
        )
        self.step_summaries = Counter(
            "watchdog_coordinator_step_summaries_total",
            "Ranks' step statistics in accepted reports: taken from the agent's summary (used), or computed here "
            "because the summary did not end at the newest sample kept here (computed)",
            ["outcome"],
            registry=r,
        )
        self.acks_dropped = Counter(
            "watchdog_coordinator_report_acks_dropped_total",
            f"Command acks beyond {MAX_ACKS_PER_REPORT} in one report, dropped unread",
            registry=r,
        )
        self.tick = Histogram(
            "watchdog_coordinator_tick_duration_seconds",
            "Time one tick (all detectors and bookkeeping) took",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        # The tick thread shares the interpreter with the request loop: under a full loop
        # its duration is about twice its own work. This is the work alone.
        self.tick_cpu = Histogram(
            "watchdog_coordinator_tick_cpu_seconds",
            "CPU time the tick thread spent on one tick: its duration less the time it waited "
            "(for the request loop, which shares the interpreter with it, or for the machine)",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        self.gc_full = Gauge(
            "watchdog_coordinator_gc_full_collection_seconds",
            "Duration of the last periodic full garbage collection (every 10 min; it holds the interpreter, "
            "so reports wait meanwhile; not in the tick histograms)",
            registry=r,
        )
        self.commands = Counter(
            "watchdog_coordinator_commands_total",
            "Commands to agents, by type and outcome (sent per attempt; done, failed, refused by the agent, or expired unanswered)",
            ["type", "outcome"],
            registry=r,
        )
        self.bottleneck = Gauge(
            "watchdog_coordinator_bottleneck",
            "1 for the job's current bottleneck verdict (data, communication, straggler, memory, compute, unknown), 0 for the others",
            ["verdict"],
            registry=r,
        )
        self.bottleneck_share = Gauge(
            "watchdog_coordinator_bottleneck_share",
            "Share of step time each cause takes over recent steps (memory: share of the fullest accelerator's memory in use)",
            ["cause"],
            registry=r,
        )
        self.split_clock = Gauge(
            "watchdog_coordinator_step_split_clock",
            "1 for the clock the step split (bottleneck shares, straggler windows) comes from: gpu (accelerator completion times), cpu (the hook's marks), mixed; 0 for the others",
            ["clock"],
            registry=r,
        )
        self.goodput_seconds = Counter(
            "watchdog_coordinator_goodput_seconds_total",
            "Job wall time by what it went to (productive, data_wait, collective_wait, straggler, checkpoint_eval, restart, redone, startup); the categories add up to wall time",
            ["category"],
            registry=r,
        )
        self.steps_lost = Counter(
            "watchdog_coordinator_steps_lost",
            "Training steps recoveries cost, whoever restarted the job (the monitor, or the launcher on its own): from the step a fault stopped the job at to the step the restarted job resumed from",
            registry=r,
        )
        self.goodput_ratio = Gauge(
            "watchdog_coordinator_goodput_ratio", "Productive share of the job's wall time so far", registry=r
        )
        self.behind = Gauge(
            "watchdog_coordinator_behind_seconds",
            "How late the request loop runs (worst over the last second): how long a report waits before it is handled",
            registry=r,
        )
        self.advised_interval = Gauge(
            "watchdog_coordinator_advised_report_interval_seconds",
            "Report interval the coordinator asks agents for while it is behind (0: none asked)",
            registry=r,
        )
        self.advised_steps_interval = Gauge(
            "watchdog_coordinator_advised_steps_interval_seconds",
            "How often the coordinator asks agents to send step samples, at hundreds of reports a second "
            "(0: in every report)",
            registry=r,
        )
        self.job_state = Gauge(
            "watchdog_coordinator_job_state",
            "1 for the job's state in the monitor's state machine (running, degraded: findings open, checkpointing, "
            "restarting, aborting: an action in progress, failed: aborted or given up), 0 for the others",
            ["state"],
            registry=r,
        )
        self.actions = Counter(
            "watchdog_coordinator_actions_total",
            "Actions the policy took on the job, by action and outcome (started, then succeeded or failed; dry_run: "
            "journaled only)",
            ["action", "outcome"],
            registry=r,
        )
        self.restarts = Counter(
            "watchdog_coordinator_restarts_total",
            "Restarts of the job's workers the monitor started (every restarting action)",
            registry=r,
        )
        self.journal_errors = Counter(
            "watchdog_coordinator_journal_errors_total", "Journal writes that failed", registry=r
        )
        # Hosts to avoid, across jobs: the shipped recording rules sum these over every
        # coordinator into a decaying per-host suspicion score (`watchdog hosts`). Series
        # are made at 0 when a host is first seen, so the first culprit finding is an
        # increase Prometheus sees, not a series that starts at 1 (host_culprits.py).
        self.host_culprits = HostCulprits(r)
        self._registry = r
        self._detector_gauges = {
            STRAGGLER_SCORE: self.straggler,
            HANG_SECONDS: self.hang,
            HANG_DEADLINE_SECONDS: self.hang_deadline,
        }
        self._labels_set: dict[str, dict[str, float]] = {}  # labelled detector gauge -> the values exported
        # labelled detector gauge -> the mapping last exported (held: its id is not reused while here)
        self._labels_from: dict[str, Mapping] = {}
        # Children exist from the start, so a zero is a zero and not a missing series.
        for kind in KINDS:
            self.findings.labels(kind)
            self.active.labels(kind).set(0)
            self.resolved.labels(kind)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for name in detectors:
            self.det_errors.labels(name)
        for v in VERDICTS:
            self.bottleneck.labels(v).set(1 if v == "unknown" else 0)
        for cause in VERDICT_SHARES:
            self.bottleneck_share.labels(cause).set(0)
        for clock in SPLIT_CLOCKS:
            self.split_clock.labels(clock).set(1 if clock == "cpu" else 0)
        for cat in GOODPUT_CATEGORIES:
            self.goodput_seconds.labels(cat)
        for kind in COMMAND_TYPES:
            for outcome in COMMAND_OUTCOMES:
                self.commands.labels(kind, outcome)
        self.set_job_state(JobState.RUNNING)
        for action in ACTIONS:
            if action != "alert":
                for outcome in ACTION_OUTCOMES:
                    self.actions.labels(action, outcome)

    def set_job_state(self, state: JobState) -> None:
        for s in JobState:
            self.job_state.labels(s.value).set(1 if s is state else 0)

    def exposition(self) -> bytes:
        """/metrics: what ``generate_latest(registry)`` gives, the per-host culprit
        series from their kept text."""
        return generate_latest(Without(self._registry, HOST_CULPRITS)) + self.host_culprits.exposition()

    def set_detector_gauges(self, values: GaugeValues) -> None:
        """Export what a detector handed out (names checked by the runner)."""
        for name, value in values.items():
            gauge = self._detector_gauges[name]
            if not isinstance(value, Mapping):
                gauge.set(value)
                continue
            if self._labels_from.get(name) is value:
                continue  # the same mapping as last tick (a detector's kept answer): every series already holds it
            self._labels_from[name] = value
            before = self._labels_set.get(name, {})
            for label in before.keys() - value.keys():
                gauge.remove(label)  # a rank no longer scored: no stale series
            for label, v in value.items():
                if before.get(label) != v:  # only the series that moved: 16,384 of them at 16,384 ranks
                    gauge.labels(label).set(v)
            self._labels_set[name] = dict(value)
