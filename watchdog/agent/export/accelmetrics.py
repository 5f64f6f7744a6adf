"""Accelerator metric families from an NVML sample, and their collector."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric

from watchdog.agent.export import metrics as m
from watchdog.agent.export.nvml import Accelerators, AccelSnapshot, Disabled
from watchdog.agent.slotfiles.local_rank import LocalRank


def accelerator_families(snap: AccelSnapshot, host: str, ranks: Iterable[LocalRank] = ()) -> list[Metric]:
    """``ranks``: this host's ranks; each whose process NVML lists on a device gets
    an ``accelerator_rank_info`` series (by its pid in the agent's namespace)."""
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
    )
    on_device = {v.pid_here: v for v in ranks}
    for d in snap.devices:
        lab = [host, str(d.index)]
        fams[m.ACCEL_INFO].add_metric(lab + [d.name, d.uuid], 1.0)
        for spec, attr in fields:
            value = getattr(d, attr)
            if value is not None:
                fams[spec].add_metric(lab, float(value))
        if d.xid_errors is not None:  # None: XID events unsupported on this device
            for code, n in d.xid_codes or (("none", 0),):
                fams[m.ACCEL_XID].add_metric(lab + [str(code)], float(n))
        for pid in d.pids:
            v = on_device.get(pid)
            if v is not None:
                ident = v.identity
                fams[m.ACCEL_RANK_INFO].add_metric(
                    [ident.job, str(ident.rank), str(ident.local_rank), host, str(d.index), d.uuid], 1.0
                )
    return [avail, count, *fams.values()]


class AcceleratorCollector:
    name = "accelerator"

    def __init__(
        self,
        accelerators: Accelerators | Disabled,
        host: str,
        clock: Callable[[], float] = time.monotonic,
        ranks: Callable[[], Iterable[LocalRank]] = tuple,
    ):
        self._acc, self._host, self._clock, self._ranks = accelerators, host, clock, ranks

    def collect(self) -> list[Metric]:
        return accelerator_families(self._acc.sample(self._clock()), self._host, self._ranks())
