"""The per-host culprit counters (``watchdog_coordinator_host_culprit_findings_total``),
kept as plain counts and rendered for /metrics only when one changed.

Every host the job runs on has a series at 0 for every finding kind from the
moment it is first seen, so that a host's first failure is an increase
Prometheus sees, not a series that starts at 1. At 2,048 hosts that is 18,432
series, nearly all of them 0 and unchanged for the life of the job; as a
prometheus_client ``Counter`` they were collected and formatted on every scrape,
~150 ms of the coordinator's request loop at 16,384 ranks. They change only when
a host is first seen or a finding blames one, so their text is kept and made
again on the first scrape after a change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from ..contracts.finding import KINDS

NAME = "watchdog_coordinator_host_culprit_findings"
HELP = "Findings opened that named a culprit on this host, by cause (the finding kind)"
LABELS = ("training_job", "host", "cause")


class HostCulprits(Collector):
    """A collector for the registry (``registry.get_sample_value`` and any plain
    ``generate_latest`` see the series as before) that also hands out its own
    text, made once per change (``exposition``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._counts: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()  # the tick thread counts, the request loop renders
        self._version = 0
        self._family: tuple[int, CounterMetricFamily] | None = None
        self._text: tuple[int, bytes] | None = None
        if registry is not None:
            registry.register(self)

    def seen(self, job: str, host: str) -> None:
        """A host's series, at 0 for every kind it has none for yet."""
        with self._lock:
            before = len(self._counts)
            for kind in KINDS:
                self._counts.setdefault((job, host, kind), 0.0)
            if len(self._counts) != before:
                self._version += 1

    def inc(self, job: str, host: str, cause: str) -> None:
        with self._lock:
            key = (job, host, cause)
            self._counts[key] = self._counts.get(key, 0.0) + 1.0
            self._version += 1

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(NAME, HELP, labels=LABELS)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            if self._family is None or self._family[0] != self._version:
                family = CounterMetricFamily(NAME, HELP, labels=LABELS)
                for labels, value in self._counts.items():
                    family.add_metric(labels, value)
                self._family = (self._version, family)
            family = self._family[1]
        yield family

    def exposition(self) -> bytes:
        """This family in the text format, exactly as ``generate_latest`` writes it."""
        with self._lock:
            version = self._version
            if self._text is not None and self._text[0] == version:
                return self._text[1]
        text = generate_latest(self)
        with self._lock:
            self._text = (version, text)  # made from `version` or later: at worst made again next time
        return text


class Without(Collector):
    """A registry's families but one (by name), for ``generate_latest``."""

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        self._registry, self._name = registry, name

    def collect(self) -> Iterator:
        return (f for f in self._registry.collect() if f.name != self._name)
