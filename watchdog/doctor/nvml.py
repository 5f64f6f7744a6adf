"""NVML: accelerator metrics (utilisation, memory, power, Xid errors)."""

from __future__ import annotations

import glob
import importlib
from typing import Any

from .check import AGENT, FIX, OK, WARN, Host, Result

INSTALL = "pip install nvidia-ml-py in the agent's environment"


class Nvml:
    name = "nvml"
    roles = frozenset({AGENT})

    def __init__(self, module: Any = None) -> None:
        self._module = module  # pynvml, or a fake in tests

    def check(self, host: Host) -> Result:
        gpus = bool(glob.glob(f"{host.dev_root}/nvidia[0-9]*"))
        status = FIX if gpus else WARN
        nv = self._module
        if nv is None:
            try:
                nv = importlib.import_module("pynvml")
            except ImportError:
                what = "NVIDIA devices present but pynvml is not installed" if gpus else "pynvml not installed"
                return Result(self.name, status, f"{what}: no accelerator metrics", INSTALL)
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            driver = nv.nvmlSystemGetDriverVersion()
        except Exception as exc:  # noqa: BLE001 - NVMLError and its generated subclasses
            return Result(
                self.name,
                status,
                f"NVML does not start: {type(exc).__name__}: {exc}" + ("" if gpus else " (no NVIDIA device here)"),
                "install the NVIDIA driver, or run the agent with --collector.accelerator=false on CPU hosts",
            )
        finally:
            try:
                nv.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that never started
                pass
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return Result(self.name, OK, f"NVML: {count} device(s), driver {driver}")
