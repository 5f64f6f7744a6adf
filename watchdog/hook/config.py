"""The hook's configuration: read once at install, frozen, validated loudly.

Precedence: keyword overrides to ``install()`` > environment > defaults. torchrun
provides RANK / LOCAL_RANK / WORLD_SIZE / TORCHELASTIC_*; without them, Open MPI,
PMI and Slurm's own variables say where the process is (``launcher``); without
any, the process is a single rank (0 of 1). An empty environment variable counts as unset (shells
and launchers export empty values more often than they mean them).

Every bad value raises ValueError naming the variable (or the keyword), because
this runs once, at install, where failing loudly is cheap and the alternative is
a monitor that silently watches the wrong rank.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from watchdog import flags, rundir
from watchdog.contracts import slot as wire
from watchdog.hook.lifecycle import launcher

log = logging.getLogger("watchdog.hook")

_TRUE = ("1", "true")
_FALSE = ("0", "false")


@dataclass(frozen=True)
class HookConfig:
    enabled: bool = True
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    job: str = "default"
    run_dir: str = ""
    host: str = ""
    run_id: str = ""  # TORCHELASTIC_RUN_ID ("" outside torchrun)
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT
    ring_capacity: int = wire.DEFAULT_RING_CAPACITY
    heartbeat_interval_s: float = 0.5
    auto_step: bool = False
    patch_collectives: bool = True
    # torchrun: init_process_group on the elastic agent's store scoped to the restart attempt
    restart_safe_init: bool = True
    # Read PyTorch's Flight Recorder from the background thread (watchdog.hook.completion.flight_recorder)
    flight_recorder: bool = True
    # GPU-side completion times through CUDA events polled off the training thread (watchdog.hook.completion.tracker)
    gpu_completion: bool = True
    # Progress the script does not report: forwards, backwards, optimizer steps, and the
    # automatic eval phase they open (watchdog.hook.marks.progress)
    progress: bool = True
    # An automatic eval phase closes after this long without progress (a rank that stops working alone)
    progress_stale_s: float = 2.0
    max_errors: int = 100  # caught hook errors before the monitor turns itself off

    @property
    def slot_run_id(self) -> str:
        """What goes in the slot's run_id identity field: ``<run_id>:<restart_count>``.
        Split it with ``rpartition(":")``; the attempt number tells the agent which
        torchelastic restart a slot belongs to."""
        return f"{self.run_id}:{self.restart_count}"


# field -> environment variable (None: keyword only). Job, host and run dir are
# the names the agent and coordinator read too (watchdog.flags).
ENV = {
    "enabled": "WATCHDOG_ENABLED",
    "rank": "RANK",
    "local_rank": "LOCAL_RANK",
    "world_size": "WORLD_SIZE",
    "job": flags.env_of(flags.JOB_NAME),
    "run_dir": rundir.RUN_DIR_ENV,
    "host": flags.env_of(flags.HOST_NAME),
    "run_id": "TORCHELASTIC_RUN_ID",
    "restart_count": "TORCHELASTIC_RESTART_COUNT",
    "ring_capacity": "WATCHDOG_RING_CAPACITY",
    "heartbeat_interval_s": "WATCHDOG_HEARTBEAT_INTERVAL_S",
    "auto_step": "WATCHDOG_AUTO_STEP",
    "patch_collectives": "WATCHDOG_PATCH_COLLECTIVES",
    "restart_safe_init": "WATCHDOG_RESTART_SAFE_INIT",
    "flight_recorder": "WATCHDOG_FLIGHT_RECORDER",
    "gpu_completion": "WATCHDOG_GPU_COMPLETION",
    "progress": "WATCHDOG_PROGRESS",
    "progress_stale_s": "WATCHDOG_PROGRESS_STALE_S",
    "max_errors": None,
}
FIELDS = tuple(f.name for f in fields(HookConfig))
# field -> the shared setting whose deprecated variables the hook still reads
_SHARED = {"job": flags.JOB_NAME, "host": flags.HOST_NAME}
OLD_ENV_VARS = tuple(old for name in _SHARED.values() for old in flags.OLD_ENV[name])


def default_run_dir(env: Mapping[str, str]) -> str:
    return rundir.default_run_dir(env)


def _parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected 0, 1, true or false")


def _parse_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected an integer")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer") from None


def _parse_float(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: expected a number") from None
    return out


def _parse_str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r}: expected a string")
    return value


_PARSERS = {
    bool: _parse_bool,
    int: _parse_int,
    float: _parse_float,
    str: _parse_str,
}
_TYPES = get_type_hints(HookConfig)


def _raw_values(env: Mapping[str, str], overrides: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """field -> (raw value, the name to blame in an error message)."""
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ValueError(f"install(): unknown setting(s) {', '.join(unknown)}; valid: {', '.join(FIELDS)}")
    out: dict[str, tuple[Any, str]] = {}
    for name in FIELDS:
        if name in overrides and overrides[name] is not None:
            out[name] = (overrides[name], f"install({name}=...)")
            continue
        var = ENV[name]
        if var is not None and env.get(var, "").strip() != "":
            out[name] = (env[var], var)
        elif name in _SHARED:
            old = next((o for o in flags.OLD_ENV[_SHARED[name]] if env.get(o, "").strip() != ""), None)
            if old is not None:
                out[name] = (env[old], old)
    launch = launcher.detect(env)  # srun / mpirun: their variables where RANK & co. are absent
    for name in ("rank", "local_rank", "world_size"):
        found = getattr(launch, name)
        if name not in out and found is not None:
            out[name] = found
    return out


def warnings_for(env: Mapping[str, str]) -> list[str]:
    """Deprecated variables in ``env``, one message each (install logs them)."""
    return [w for w in (flags.deprecated_env(n, env) for n in _SHARED.values()) if w]


def _convert(raw: dict[str, tuple[Any, str]], name: str, default: Any) -> Any:
    if name not in raw:
        return default
    value, blame = raw[name]
    return _PARSERS[_TYPES[name]](value, blame)


def is_enabled(env: Mapping[str, str], overrides: Mapping[str, Any]) -> bool:
    """Only the switch, so a disabled hook never parses (or trips over) the rest."""
    raw = _raw_values(env, overrides)
    return _convert(raw, "enabled", True)


def load_config(
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    agree: Callable[[Mapping[str, str]], str | None] | None = None,
) -> HookConfig:
    """``agree(env)``: asked for a job id only when nothing names the job and
    torchrun's run id is its shared default ``none`` (``watchdog.hook.lifecycle.jobid.agree``
    at install; None keeps the default name)."""
    env = os.environ if env is None else env
    raw = _raw_values(env, overrides or {})
    d = HookConfig()
    v = {name: _convert(raw, name, getattr(d, name)) for name in FIELDS}
    _fill_in(v, raw, env, agree)
    _check(v, lambda name: raw[name][1] if name in raw else name)
    return HookConfig(**v)


def _fill_in(
    v: dict[str, Any],
    raw: Mapping[str, Any],
    env: Mapping[str, str],
    agree: Callable[[Mapping[str, str]], str | None] | None,
) -> None:
    """What the environment decides when no setting says: the job, the run dir, the host."""
    if "job" not in raw:  # the launcher's job id names the job unless WATCHDOG_JOB_NAME does
        found = launcher.job_id(env)
        if found is None and agree is not None and launcher.needs_agreement(env):
            found = agree(env)
        if found:
            v["job"] = found
    if not v["run_dir"]:
        v["run_dir"] = default_run_dir(env)
        note = rundir.fallback_note(v["run_dir"])
        if note:
            log.warning("watchdog.hook %s", note)
    for warning in warnings_for(env):
        log.warning("watchdog.hook %s", warning)
    if not v["host"]:
        v["host"] = socket.gethostname()


def _check(v: Mapping[str, Any], blame: Callable[[str], str]) -> None:
    """Misuse fails at install: ``blame(name)`` says which setting gave the value."""
    if v["world_size"] < 1:
        raise ValueError(f"{blame('world_size')}={v['world_size']}: world size must be >= 1")
    if not 0 <= v["rank"] < v["world_size"]:
        raise ValueError(
            f"{blame('rank')}={v['rank']}: rank must be in 0..{v['world_size'] - 1} "
            f"(world size {v['world_size']} from {blame('world_size')})"
        )
    if v["local_rank"] < 0:
        raise ValueError(f"{blame('local_rank')}={v['local_rank']}: local rank must be >= 0")
    if v["restart_count"] < 0:
        raise ValueError(f"{blame('restart_count')}={v['restart_count']}: restart count must be >= 0")
    if not 1 <= v["ring_capacity"] <= wire.MAX_RING_CAPACITY:
        raise ValueError(
            f"{blame('ring_capacity')}={v['ring_capacity']}: ring capacity must be in 1..{wire.MAX_RING_CAPACITY}"
        )
    hb = v["heartbeat_interval_s"]
    if not (math.isfinite(hb) and 0 < hb <= 3600):
        raise ValueError(f"{blame('heartbeat_interval_s')}={hb}: heartbeat interval must be in (0, 3600] seconds")
    stale = v["progress_stale_s"]
    if not (math.isfinite(stale) and 0 < stale <= 3600):
        raise ValueError(f"{blame('progress_stale_s')}={stale}: must be in (0, 3600] seconds")
    if v["max_errors"] < 1:
        raise ValueError(f"{blame('max_errors')}={v['max_errors']}: must be >= 1")
    if not v["job"].strip():
        raise ValueError(f"{blame('job')}={v['job']!r}: job name must not be empty")
