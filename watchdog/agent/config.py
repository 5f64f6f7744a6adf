"""Agent flags -> one frozen ``AgentConfig``. Precedence CLI > WATCHDOG_ env > default
(``watchdog.flags``); every bad value is a FlagError naming the flag and its origin."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from watchdog import flags
from watchdog.flags import Flag, FlagError

LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(text: str) -> str:
    low = text.strip().lower()
    if low not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return low


def _url(text: str) -> str:
    text = text.strip().rstrip("/")
    if text and not text.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https:// (or be empty to not report)")
    return text


FLAGS: tuple[Flag, ...] = (
    Flag("run-dir", "", "directory holding the ranks' slot files (required)"),
    Flag("web.listen-address", "0.0.0.0:19400", "HOST:PORT for /metrics and /healthz; port 0 picks a free port",
         flags.listen_address),
    Flag("web.address-file", "", "write the bound HOST:PORT to this file once listening (for tests and demos)"),
    Flag("job.name", "", "only watch slots of this job (empty = every job on this host)"),
    Flag("host.name", "", "host label and report host (empty = this machine's hostname)"),
    Flag("poll.interval-seconds", 0.1, "how often the slot files and rank processes are read", flags.positive_float),
    Flag("stale.after-seconds", 30.0,
         "a slot whose process is gone when first seen and whose last heartbeat is older than this is ignored",
         flags.positive_float),
    Flag("coordinator.url", "", "coordinator base URL, e.g. http://coord:19401 (empty = do not report)", _url),
    Flag("report.interval-seconds", 1.0, "how often a report is sent to the coordinator", flags.positive_float),
    Flag("coordinator.timeout-seconds", 2.0, "HTTP timeout of one report", flags.positive_float),
    Flag("job.token-file", "", "file holding the shared job token (preferred over --job.token)"),
    Flag("job.token", "", "shared job token; prefer --job.token-file or WATCHDOG_JOB_TOKEN (argv is world-readable)",
         secret=True),
    Flag("stacks.py-spy", "", "path of the py-spy binary for stack dumps (empty = next to this Python, then PATH)"),
    Flag("stacks.timeout-seconds", 10.0, "a py-spy dump taking longer than this is abandoned", flags.positive_float),
    Flag("collector.accelerator", True, "sample accelerators through NVML", flags.boolean),
    Flag("log.level", "info", f"one of {', '.join(LOG_LEVELS)}", _log_level),
)


@dataclass(frozen=True)
class AgentConfig:
    run_dir: str
    listen: tuple[str, int]
    address_file: str = ""
    job: str = ""
    host: str = ""
    poll_interval_s: float = 0.1
    stale_after_s: float = 30.0
    coordinator_url: str = ""
    report_interval_s: float = 1.0
    report_timeout_s: float = 2.0
    accelerator: bool = True
    py_spy: str = ""
    stacks_timeout_s: float = 10.0
    log_level: str = "info"
    token: str = field(default="", repr=False)
    token_from_argv: bool = False  # worth a warning: visible to every user through ps
    effective: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # for the start-up log


def load(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    environ = os.environ if environ is None else environ
    v = flags.parse("watchdog agent", "Per-host rank-watchdog agent.", FLAGS, argv, environ)
    if not v["run_dir"]:
        raise FlagError("--run-dir (or WATCHDOG_RUN_DIR) is required")
    token, from_argv = v["job_token"], False
    if v["job_token_file"]:
        try:
            with open(v["job_token_file"], encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise FlagError(f"--job.token-file={v['job_token_file']!r}: {exc.strerror or exc}") from None
        if not token:
            raise FlagError(f"--job.token-file={v['job_token_file']!r}: file is empty")
    elif token:
        from_argv = any(a == "--job.token" or a.startswith("--job.token=") for a in argv or ())
    return AgentConfig(
        run_dir=v["run_dir"],
        # flags.parse hands defaults through unconverted: the default is the string form.
        listen=v["web_listen_address"],
        address_file=v["web_address_file"],
        job=v["job_name"],
        host=v["host_name"] or socket.gethostname(),
        poll_interval_s=v["poll_interval_seconds"],
        stale_after_s=v["stale_after_seconds"],
        coordinator_url=v["coordinator_url"],
        report_interval_s=v["report_interval_seconds"],
        report_timeout_s=v["coordinator_timeout_seconds"],
        accelerator=v["collector_accelerator"],
        py_spy=v["stacks_py_spy"],
        stacks_timeout_s=v["stacks_timeout_seconds"],
        log_level=v["log_level"],
        token=token,
        token_from_argv=from_argv,
        effective=flags.loggable(FLAGS, v),
    )
