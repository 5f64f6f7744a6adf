"""Accelerator metric families from an NVML sample, and their collector."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.core import Metric

from watchdog.agent import metrics as m
from watchdog.agent.nvml import Accelerators, AccelSnapshot, Disabled


def accelerator_families(snap: AccelSnapshot, host: str) -> list[Metric]:
    avail, count = m.ACCEL_AVAILABLE.family(), m.ACCELERATORS.family()
    avail.add_metric([], float(snap.available))
    count.add_metric([], len(snap.devices))
    fams = {s: s.family() for s in m.ACCEL_SPECS}
    fields = (
        (m.ACCEL_UTIL, "util_ratio"),
        (m.ACCEL_MEM_UTIL, "mem_util_ratio"),
        (m.ACCEL_MEM_USED, "mem_used_bytes"),
        (m.ACCEL_MEM_TOTAL, "mem_total_bytes"),
        (m.ACCEL_TEMP, "temperature_c"),
        (m.ACCEL_POWER, "power_w"),
        (m.ACCEL_SM_CLOCK, "sm_clock_hz"),
        (m.ACCEL_THROTTLE, "throttle_reasons"),
        (m.ACCEL_XID, "xid_errors"),
    )
    for d in snap.devices:
        lab = [host, str(d.index)]
        fams[m.ACCEL_INFO].add_metric(lab + [d.name, d.uuid], 1.0)
        for spec, attr in fields:
            value = getattr(d, attr)
            if value is not None:
                fams[spec].add_metric(lab, float(value))
    return [avail, count, *fams.values()]


class AcceleratorCollector:
    name = "accelerator"

    def __init__(self, accelerators: Accelerators | Disabled, host: str, clock: Callable[[], float] = time.monotonic):
        self._acc, self._host, self._clock = accelerators, host, clock

    def collect(self) -> list[Metric]:
        return accelerator_families(self._acc.sample(self._clock()), self._host)
