"""Enough of a ``pynvml`` module for the accelerator collector, with faults on demand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class FakeNvml:
    """Enough of ``pynvml`` for the accelerator collector: ``gpus`` is a list of
    dicts of device values; ``xid`` maps a device index to XID codes still to
    deliver; ``unsupported`` names functions that raise NVMLError_NotSupported;
    ``init_error`` makes nvmlInit raise that NVML error code."""

    def __init__(self, gpus: list[dict], *, init_error: int | None = None, xid: dict[int, list[int]] | None = None,
                 unsupported: set[str] = frozenset()) -> None:
        import pynvml

        self._p = pynvml
        self.NVMLError = pynvml.NVMLError
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus, self.init_error = gpus, init_error
        self.xid = {i: list(v) for i, v in (xid or {}).items()}
        self.unsupported = set(unsupported)
        self.calls: dict[str, int] = {}

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.unsupported:
            raise self._p.NVMLError(self._p.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise self._p.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _get(self, name: str, h: int, key: str) -> Any:
        self._call(name)
        return self.gpus[h][key]

    def nvmlDeviceGetName(self, h): return self._get("nvmlDeviceGetName", h, "name")  # noqa: E704
    def nvmlDeviceGetUUID(self, h): return self._get("nvmlDeviceGetUUID", h, "uuid")  # noqa: E704
    def nvmlDeviceGetTemperature(self, h, sensor): return self._get("nvmlDeviceGetTemperature", h, "temp")  # noqa
    def nvmlDeviceGetPowerUsage(self, h): return self._get("nvmlDeviceGetPowerUsage", h, "power_mw")  # noqa: E704
    def nvmlDeviceGetClockInfo(self, h, clk): return self._get("nvmlDeviceGetClockInfo", h, "sm_mhz")  # noqa: E704

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get("nvmlDeviceGetCurrentClocksEventReasons", h, "throttle")

    def nvmlDeviceGetUtilizationRates(self, h):
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.gpus[h]["util"], memory=self.gpus[h]["mem_util"])

    def nvmlDeviceGetMemoryInfo(self, h):
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=self.gpus[h]["mem_used"], total=self.gpus[h]["mem_total"], free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in self.gpus[h].get("pids", ())]

    def nvmlEventSetCreate(self):
        self._call("nvmlEventSetCreate")
        return {"devices": []}

    def nvmlDeviceRegisterEvents(self, h, types, es) -> None:
        self._call("nvmlDeviceRegisterEvents")
        es["devices"].append(h)

    def nvmlEventSetWait_v2(self, es, timeout_ms):
        self._call("nvmlEventSetWait_v2")
        for h in es["devices"]:
            if self.xid.get(h):
                return SimpleNamespace(device=h, eventType=self._p.nvmlEventTypeXidCriticalError,
                                       eventData=self.xid[h].pop(0))
        raise self._p.NVMLError(self._p.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, es) -> None:
        self._call("nvmlEventSetFree")
