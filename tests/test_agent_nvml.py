"""Accelerator collector: the GPU path through a fake pynvml, and the real
"no NVML library here" path through the real pynvml."""

import pynvml
import pytest

from watchdog.agent import testing
from watchdog.agent.export.accelmetrics import accelerator_families
from watchdog.agent.export.nvml import Accelerators


class Log:
    def __init__(self):
        self.events = []

    def __getattr__(self, level):
        return lambda event, **kw: self.events.append((level, event, kw))


def gpu(i, **kw):
    d = {
        "name": b"Fake H100",
        "uuid": f"GPU-{i}",
        "util": 50 + i,
        "mem_util": 10,
        "mem_used": 1 << 30,
        "mem_total": 80 << 30,
        "temp": 55,
        "power_mw": 123_456,
        "sm_mhz": 1500,
        "throttle": 0x4,
        "pids": [4242],
    }
    d.update(kw)
    return d


def test_gpu_path_reads_every_field():
    acc = Accelerators(testing.FakeNvml([gpu(0), gpu(1)]), log=Log())
    snap = acc.sample(0.0)
    assert snap.available and len(snap.devices) == 2
    d = snap.devices[1]
    assert (d.index, d.name, d.uuid) == (1, "Fake H100", "GPU-1")
    assert d.util_ratio == pytest.approx(0.51) and d.mem_util_ratio == pytest.approx(0.10)
    assert (d.mem_used_bytes, d.mem_total_bytes) == (1 << 30, 80 << 30)
    assert (d.temperature_c, d.power_w, d.sm_clock_hz) == (55.0, 123.456, 1.5e9)
    assert d.throttle_reasons == 0x4 and d.pids == (4242,) and d.xid_errors == 0
    assert d.to_dict()["uuid"] == "GPU-1"


def test_xid_events_are_counted_per_device_without_blocking():
    nv = testing.FakeNvml([gpu(0), gpu(1)], xid={1: [79, 48]})
    acc = Accelerators(nv, min_interval_s=0, log=Log())
    first = acc.sample(0.0)
    assert [d.xid_errors for d in first.devices] == [0, 2]
    assert first.devices[1].last_xid == 48
    nv.xid[0] = [13]
    assert [d.xid_errors for d in acc.sample(1.0).devices] == [1, 2]  # a counter: never goes down


def test_unsupported_fields_and_xid_are_left_out_not_fatal():
    nv = testing.FakeNvml([gpu(0)], unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceRegisterEvents"})
    (d,) = Accelerators(nv, log=Log()).sample(0.0).devices
    assert d.power_w is None and d.xid_errors is None and d.temperature_c == 55.0
    fams = {f.name: f for f in accelerator_families(Accelerators(nv, log=Log()).sample(0.0), "h")}
    assert fams["watchdog_accelerator_power_watts"].samples == []
    assert fams["watchdog_accelerator_xid_errors"].samples == []
    assert len(fams["watchdog_accelerator_temperature_celsius"].samples) == 1


def test_samples_are_shared_within_the_min_interval():
    nv = testing.FakeNvml([gpu(0)])
    acc = Accelerators(nv, min_interval_s=0.5, log=Log())
    acc.sample(10.0)
    acc.sample(10.2)
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 1
    acc.sample(10.6)
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 2


def test_driver_not_loaded_is_a_state_logged_once_and_retried_rarely():
    nv = testing.FakeNvml([gpu(0)], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    log = Log()
    acc = Accelerators(nv, retry_s=60, min_interval_s=0, log=log)
    for t in range(0, 59, 1):
        assert not acc.sample(float(t)).available
    assert nv.calls["nvmlInit"] == 1
    assert log.events == [("info", "no accelerator", log.events[0][2])]
    nv.init_error = None  # driver loaded later
    snap = acc.sample(61.0)
    assert snap.available and nv.calls["nvmlInit"] == 2
    acc.close()
    assert nv.calls["nvmlShutdown"] == 1


def test_other_init_errors_warn():
    log = Log()
    Accelerators(testing.FakeNvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION), log=log).sample(0.0)
    assert log.events[0][:2] == ("warning", "no accelerator")


class Counting:
    """The real pynvml, counting nvmlInit calls."""

    def __init__(self):
        self.inits = 0

    def __getattr__(self, name):
        return getattr(pynvml, name)

    def nvmlInit(self):
        self.inits += 1
        return pynvml.nvmlInit()


def test_real_library_not_found():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - only on a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("an NVML library is installed here: the not-found path cannot be exercised for real")
    nv, log = Counting(), Log()
    acc = Accelerators(nv, retry_s=60, min_interval_s=0, log=log)
    snaps = [acc.sample(float(t)) for t in range(5)]
    assert not any(s.available for s in snaps)
    assert "LibraryNotFound" in snaps[0].reason
    assert nv.inits == 1
    assert [(lvl, e) for lvl, e, _ in log.events] == [("info", "no accelerator")]
    fams = {f.name: f for f in accelerator_families(snaps[-1], "h")}
    assert fams["watchdog_accelerator_available"].samples[0].value == 0.0
    assert fams["watchdog_accelerators"].samples[0].value == 0.0


def test_xid_code_is_a_label_on_the_xid_counter():
    nv = testing.FakeNvml([gpu(0), gpu(1)], xid={1: [79, 48, 79]})
    fams = {f.name: f for f in accelerator_families(Accelerators(nv, log=Log()).sample(0.0), "h")}
    got = {(s.labels["gpu"], s.labels["xid"]): s.value for s in fams["watchdog_accelerator_xid_errors"].samples}
    assert got == {("0", "none"): 0.0, ("1", "48"): 1.0, ("1", "79"): 2.0}


def test_each_rank_is_joined_to_the_gpu_its_process_runs_on():
    """NVML lists pid 4242 on GPU 1: rank 3 (that pid) gets the info series naming
    GPU 1 and its uuid; a rank on no GPU gets none."""
    from watchdog.agent.processes.table import ProcSample
    from watchdog.agent.slotfiles import slot_states
    from watchdog.agent.slotfiles.local_rank import LocalRank

    def rank(r, pid):
        snap = testing.snapshot(testing.identity("train", r, 4, pid=pid, proc_start_us=7, local_rank=r), {})
        return LocalRank(snap.path, snap.header, 0, False, ProcSample(True, "running"), slot_states.ALIVE, 0.0, ())

    nv = testing.FakeNvml([gpu(0, pids=[]), gpu(1, pids=[4242])])
    snap = Accelerators(nv, log=Log()).sample(0.0)
    fams = {f.name: f for f in accelerator_families(snap, "h", [rank(3, 4242), rank(2, 5000)])}
    (s,) = fams["watchdog_accelerator_rank_info"].samples
    assert s.labels == {
        "training_job": "train",
        "rank": "3",
        "local_rank": "3",
        "host": "h",
        "gpu": "1",
        "uuid": "GPU-1",
    }
    assert s.value == 1.0
