"""The installed torch has the Flight Recorder (a hang's collectives as evidence)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .check import FIX, OK, TRAINING, WARN, Host, Result

UPGRADE = "install a torch with distributed support and the Flight Recorder (2.5 or later)"


def _c10d() -> Any:
    # The doctor may import torch (the hook never does); the extension holds the dump function.
    import torch.distributed  # noqa: F401

    return importlib.import_module("torch._C._distributed_c10d")


class FlightRecorder:
    name = "flight_recorder"
    roles = frozenset({TRAINING})

    def __init__(self, load: Callable[[], Any] = _c10d) -> None:
        self._load = load

    def check(self, host: Host) -> Result:
        try:
            c10d = self._load()
        except ImportError as exc:
            return Result(self.name, FIX, f"torch.distributed not importable here: {exc}", UPGRADE)
        if not callable(getattr(c10d, "_dump_fr_trace_json", None)):
            return Result(
                self.name,
                WARN,
                "this torch has no Flight Recorder dump: hang evidence comes from the hook's marks only",
                UPGRADE,
            )
        import torch

        return Result(
            self.name,
            OK,
            f"torch {torch.__version__}: Flight Recorder available (set TORCH_FR_BUFFER_SIZE before the process group)",
        )
