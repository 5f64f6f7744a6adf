"""Agent flags -> one frozen ``AgentConfig``. Precedence CLI > WATCHDOG_ env > default
(``watchdog.flags``); every bad value is a FlagError naming the flag and its origin."""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from watchdog import flags, jobtoken, logs, rundir, webconfig
from watchdog.agent.export.metrics import SERIES_PER_RANK
from watchdog.agent.export.rankmetrics import DETAILS, FULL, SUMMARY
from watchdog.flags import Flag
from watchdog.report import MAX_INTERVAL_S, MIN_INTERVAL_S

LOG_LEVELS = logs.LEVELS
# A job whose processes on this host are all gone stops being exported this long
# after the last one went (its RankWatchdogRankDead alert then resolves).
JOB_EXPIRY_DEFAULT_S = 900.0


def _uids(text: str) -> frozenset[int]:
    """Comma-separated uids or user names."""
    import pwd

    out: set[int] = set()
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        if part.isdigit():
            out.add(int(part))
        else:
            try:
                out.add(pwd.getpwnam(part).pw_uid)
            except KeyError:
                raise ValueError(f"no such user: {part!r}") from None
    return frozenset(out)


def _report_interval(text: str) -> float:
    """The coordinator refuses reports outside this range: say so at start instead."""
    val = float(text)
    if not MIN_INTERVAL_S <= val <= MAX_INTERVAL_S:
        raise ValueError(f"must be in {MIN_INTERVAL_S}..{MAX_INTERVAL_S:.0f} seconds (the coordinator refuses others)")
    return val


def _rank_detail(text: str) -> str:
    val = text.strip().lower()
    if val not in DETAILS:
        raise ValueError(f"must be {' or '.join(DETAILS)}")
    return val


def _url(text: str) -> str:
    text = text.strip().rstrip("/")
    if text and not text.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https:// (or be empty to not report)")
    return text


# Each flag names the AgentConfig field it fills (see flags.build).
FLAGS: tuple[Flag, ...] = (
    Flag(
        flags.RUN_DIR,
        "",
        f"directory holding the ranks' slot files; the ranks' {rundir.RUN_DIR_ENV} must name "
        f"the same (empty: the hook's default, {rundir.DEFAULT_RULE})",
        field="run_dir",
    ),
    Flag(
        "slots.trusted-uids",
        "",
        "users (names or uids, comma-separated) whose slot files are believed for any "
        "process and any job, and who may own the run dir; otherwise a slot counts only if its file belongs to the "
        "user of the process it names and to the user of its job's first live rank here",
        _uids,
        field="trusted_uids",
    ),
    Flag(
        "web.listen-address",
        "0.0.0.0:19400",
        "HOST:PORT for /metrics and /healthz; port 0 picks a free port",
        flags.listen_address,
        field="listen",
    ),
    Flag(
        "web.address-file",
        "",
        "write the bound HOST:PORT to this file once listening (for tests and demos)",
        field="address_file",
    ),
    Flag(
        flags.JOB_NAME,
        "",
        "only watch slots of this job (empty = every job on this host)",
        field="job",
        old_env=flags.OLD_ENV[flags.JOB_NAME],
    ),
    Flag(
        flags.HOST_NAME,
        "",
        "host label and report host (empty = this machine's hostname)",
        field="host",
        old_env=flags.OLD_ENV[flags.HOST_NAME],
    ),
    Flag(
        "poll.interval-seconds",
        0.1,
        "how often the slot files and rank processes are read",
        flags.positive_float,
        field="poll_interval_s",
    ),
    Flag(
        "stale.after-seconds",
        30.0,
        "a slot whose process is gone when first seen and whose last heartbeat is older than this is ignored",
        flags.positive_float,
        field="stale_after_s",
    ),
    Flag(
        "stale.job-expiry-seconds",
        JOB_EXPIRY_DEFAULT_S,
        "slots of a job none of whose processes on this host is alive stop being exported this long after the "
        "last one ended (the rank-dead alert resolves); never while any rank of the job here lives",
        flags.positive_float,
        field="job_expiry_s",
    ),
    Flag(
        "coordinator.url",
        "",
        "coordinator base URL, e.g. http://coord:19401 (empty = do not report)",
        _url,
        field="coordinator_url",
    ),
    Flag(
        "coordinator.url-from-run-dir",
        False,
        "report each job to the coordinator whose base URL it wrote to <run-dir>/<job>.coordinator (one agent "
        "serving per-job coordinators); believed only from the user owning all the job's slot files",
        flags.boolean,
        field="coordinator_from_run_dir",
    ),
    Flag(
        "report.interval-seconds",
        1.0,
        "how often a report is sent to the coordinator",
        _report_interval,
        field="report_interval_s",
    ),
    Flag(
        "coordinator.timeout-seconds", 2.0, "HTTP timeout of one report", flags.positive_float, field="report_timeout_s"
    ),
    Flag(
        "coordinator.ca-file",
        "",
        "CA certificate(s) that sign an https coordinator's certificate (empty: the system's)",
        field="coordinator_ca_file",
    ),
    webconfig.flag(),
    jobtoken.file_flag(f"file holding the shared job token (preferred over --{jobtoken.INLINE})"),
    jobtoken.inline_flag(
        f"shared job token; prefer --{jobtoken.FILE} or {jobtoken.INLINE_ENV} (argv is world-readable)"
    ),
    Flag(
        "stacks.py-spy",
        "",
        "path of the py-spy binary for stack dumps (empty = next to this Python, then PATH)",
        field="py_spy",
    ),
    Flag(
        "stacks.timeout-seconds",
        10.0,
        "a py-spy dump taking longer than this is abandoned",
        flags.positive_float,
        field="stacks_timeout_s",
    ),
    Flag(
        "stacks.parallel",
        8,
        "py-spy dumps run at once when the coordinator asks for many ranks of this host",
        flags.positive_int,
        field="stacks_parallel",
    ),
    Flag(
        "stacks.host-deadline-seconds",
        10.0,
        "all of one request's dumps on this host end within this; ranks not dumped by then are reported late",
        flags.positive_float,
        field="stacks_host_deadline_s",
    ),
    Flag("collector.accelerator", True, "sample accelerators through NVML", flags.boolean, field="accelerator"),
    Flag(
        "metrics.rank-detail",
        FULL,
        f"per-rank series on /metrics: {FULL} ({SERIES_PER_RANK} per rank) or {SUMMARY} (only ranks not alive and "
        f"running, and the --metrics.slowest-ranks slowest; host aggregates are exported either way): {SUMMARY} for "
        "jobs of thousands of ranks",
        _rank_detail,
        field="rank_detail",
    ),
    Flag(
        "metrics.slowest-ranks",
        1,
        "at --metrics.rank-detail=summary, how many of this host's slowest ranks (last step's compute) keep their series",
        flags.positive_int,
        field="slowest_ranks",
    ),
    logs.level_flag(),
    logs.format_flag(),
)

# AgentConfig fields load() derives instead of taking one flag's value.
NOT_FROM_FLAGS = ("token_from_argv", "token_warning", "effective", "deprecations")


@dataclass(frozen=True)
class AgentConfig:
    run_dir: str
    listen: tuple[str, int]
    address_file: str = ""
    trusted_uids: frozenset[int] = frozenset()
    job: str = ""
    host: str = ""
    poll_interval_s: float = 0.1
    stale_after_s: float = 30.0
    job_expiry_s: float = JOB_EXPIRY_DEFAULT_S
    coordinator_url: str = ""
    coordinator_from_run_dir: bool = False
    report_interval_s: float = 1.0
    report_timeout_s: float = 2.0
    coordinator_ca_file: str = ""
    web_config: str = ""  # --web.config.file: TLS and basic auth for /metrics (watchdog.webconfig)
    accelerator: bool = True
    rank_detail: str = FULL  # rankmetrics.DETAILS
    slowest_ranks: int = 1
    py_spy: str = ""
    stacks_timeout_s: float = 10.0
    stacks_parallel: int = 8
    stacks_host_deadline_s: float = 10.0
    log_level: str = "info"
    log_format: str = "json"
    token: str = field(default="", repr=False)
    token_from_argv: bool = False  # worth a warning: visible to every user through ps
    token_warning: str = ""  # e.g. the token file is readable by every user
    effective: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # for the start-up log
    deprecations: tuple[str, ...] = ()  # deprecated variables in use, for a warning at start


def load(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    environ = os.environ if environ is None else environ
    v = flags.parse("watchdog agent", "Per-host rank-watchdog agent.", FLAGS, argv, environ)
    run_dir = v["run_dir"] or rundir.default_run_dir(environ)
    token = jobtoken.read(v)  # the file wins; an unreadable or empty one is a FlagError
    coord_host = urllib.parse.urlsplit(v["coordinator_url"]).hostname or "" if v["coordinator_url"] else ""
    short = jobtoken.too_short(token, coord_host) if coord_host else None
    if short:  # the coordinator there refuses such a token too: say so here, at start
        raise flags.FlagError(short.replace("refusing to listen on", "refusing to report to"))
    if v["coordinator_url"] and v["coordinator_url_from_run_dir"]:
        raise flags.FlagError(
            "--coordinator.url and --coordinator.url-from-run-dir exclude each other: one or the other"
        )
    return flags.build(
        AgentConfig,
        FLAGS,
        v,
        run_dir=run_dir,
        host=v["host_name"] or socket.gethostname(),
        deprecations=tuple(flags.deprecations(FLAGS, environ)),
        token=token,
        token_warning=jobtoken.file_warning(v) or "",
        token_from_argv=jobtoken.inline_on_argv(v, argv),
        effective={**flags.loggable(FLAGS, v), flags.RUN_DIR: run_dir},
    )
