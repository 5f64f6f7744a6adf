"""Accelerators through NVML (``pynvml``, injected so tests can pass a fake module).

No GPU or no driver is a normal state, not an error: logged once, exported as
``watchdog_accelerator_available 0``, and NVML init is retried at most every
``retry_s`` (a failing nvmlInit costs a dlopen attempt). Each device field is
read on its own: a field the device does not support is simply not exported.
XID errors are counted from an NVML event set per device, drained without
blocking (timeout 0) at each sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from watchdog import logs

_XID_DRAIN_MAX = 256  # events per device per sample; the rest wait for the next


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    uuid: str
    util_ratio: float | None = None
    mem_util_ratio: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_hz: float | None = None
    throttle_reasons: int | None = None
    xid_errors: int | None = None  # None: XID events unsupported on this device
    last_xid: int = 0
    xid_codes: tuple[tuple[int, int], ...] = ()  # (XID code, events) seen since the agent started
    pids: tuple[int, ...] = ()  # compute processes on the device (host pid namespace)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AccelSnapshot:
    available: bool
    devices: tuple[Device, ...] = ()
    reason: str = ""  # why unavailable


class Accelerators:
    def __init__(
        self, nvml: Any = None, *, retry_s: float = 60.0, min_interval_s: float = 0.5, log: Any = None
    ) -> None:
        self._nvml = nvml
        self._retry_s, self._min_interval_s = retry_s, min_interval_s
        self._log = log or logs.get("watchdog.agent.nvml")
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._static: list[tuple[str, str]] = []  # (name, uuid)
        self._xid_sets: list[Any] = []
        self._xid_counts: list[int | None] = []
        self._last_xid: list[int] = []
        self._ready = False
        self._last_try: float | None = None
        self._reason = "not initialised yet"
        self._cached: tuple[float, AccelSnapshot] | None = None
        self._err = logs.RateLimited(60.0)

    def sample(self, now_s: float) -> AccelSnapshot:
        """Thread-safe; scrape and report share one sample per ``min_interval_s``."""
        with self._lock:
            if self._cached and now_s - self._cached[0] < self._min_interval_s:
                return self._cached[1]
            if not self._ready and not self._try_init(now_s):
                snap = AccelSnapshot(False, reason=self._reason)
            else:
                snap = AccelSnapshot(True, tuple(self._device(i, now_s) for i in range(len(self._handles))))
            self._cached = (now_s, snap)
            return snap

    def _try_init(self, now_s: float) -> bool:
        if self._last_try is not None and now_s - self._last_try < self._retry_s:
            return False
        first, self._last_try = self._last_try is None, now_s
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            nv = self._nvml
            nv.nvmlInit()
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        except ImportError as exc:
            return self._unavailable(first, f"pynvml not importable: {exc}", quiet=True)
        except Exception as exc:  # NVMLError and its generated subclasses
            quiet = getattr(exc, "value", None) in (
                getattr(self._nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", -1),
                getattr(self._nvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1),
            )
            return self._unavailable(first, f"{type(exc).__name__}: {exc}", quiet=quiet)
        nv = self._nvml
        self._handles = handles
        self._static = [(_str(_try(nv.nvmlDeviceGetName, h)), _str(_try(nv.nvmlDeviceGetUUID, h))) for h in handles]
        self._xid_sets = [self._register_xid(h) for h in handles]
        self._xid_counts = [0 if s is not None else None for s in self._xid_sets]
        self._last_xid = [0] * len(handles)
        self._xid_by_code: list[dict[int, int]] = [{} for _ in handles]
        self._ready = True
        self._log.info(
            "accelerators found",
            count=len(handles),
            names=[n for n, _ in self._static],
            xid_events=[s is not None for s in self._xid_sets],
        )
        return True

    def _unavailable(self, first: bool, reason: str, *, quiet: bool) -> bool:
        self._reason = reason
        if first:  # once: "no GPU here" is a state, not a recurring error
            (self._log.info if quiet else self._log.warning)(
                "no accelerator", reason=reason, retry_every_s=self._retry_s
            )
        return False

    def _register_xid(self, handle: Any) -> Any:
        nv = self._nvml
        try:
            es = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, es)
            return es
        except Exception:  # NotSupported / NoPermission: export no XID counter for it
            return None

    def _drain_xid(self, i: int, now_s: float) -> None:
        es = self._xid_sets[i]
        if es is None:
            return
        nv = self._nvml
        for _ in range(_XID_DRAIN_MAX):
            try:
                data = nv.nvmlEventSetWait_v2(es, 0)
            except Exception as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_TIMEOUT:  # timeout = no event pending
                    ok, suppressed = self._err.should_log(f"xid{i}", now_s)
                    if ok:
                        self._log.warning("xid event read failed", gpu=i, error=str(exc), suppressed=suppressed)
                return
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                self._xid_counts[i] = (self._xid_counts[i] or 0) + 1
                self._last_xid[i] = int(data.eventData)
                codes = self._xid_by_code[i]
                if data.eventData in codes or len(codes) < 64:  # a flood of odd codes: the total still counts
                    codes[int(data.eventData)] = codes.get(int(data.eventData), 0) + 1
                self._log.warning("xid error", gpu=i, xid=int(data.eventData))

    def _device(self, i: int, now_s: float) -> Device:
        nv, h = self._nvml, self._handles[i]
        self._drain_xid(i, now_s)
        util = _try(nv.nvmlDeviceGetUtilizationRates, h)
        mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
        power_mw = _try(nv.nvmlDeviceGetPowerUsage, h)
        clock_mhz = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        # The "throttle reasons" call was renamed "clock event reasons" in newer NVML.
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, h) or ()
        return Device(
            index=i,
            name=self._static[i][0],
            uuid=self._static[i][1],
            util_ratio=util.gpu / 100.0 if util is not None else None,
            mem_util_ratio=util.memory / 100.0 if util is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else None,
            temperature_c=_num(_try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            sm_clock_hz=clock_mhz * 1e6 if clock_mhz is not None else None,
            throttle_reasons=_try(reasons_fn, h) if reasons_fn else None,
            xid_errors=self._xid_counts[i],
            last_xid=self._last_xid[i],
            xid_codes=tuple(sorted(self._xid_by_code[i].items())),
            pids=tuple(int(p.pid) for p in procs),
        )

    def close(self) -> None:
        with self._lock:
            if not self._ready:
                return
            for es in self._xid_sets:
                if es is not None:
                    _try(self._nvml.nvmlEventSetFree, es)
            _try(self._nvml.nvmlShutdown)
            self._ready = False


def _try(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported, GpuIsLost, ...: this field only
        return None


def _num(v: Any) -> float | None:
    return float(v) if v is not None else None


def _str(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v or "")


class Disabled:
    """Stands in for Accelerators under --collector.accelerator=false."""

    def sample(self, now_s: float) -> AccelSnapshot:
        return AccelSnapshot(False, reason="disabled by --collector.accelerator")

    def close(self) -> None:
        pass
