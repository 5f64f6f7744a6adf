"""Coordinator flags and the frozen config the rest of the package reads.

Every threshold is a flag (``--hang.floor-seconds``) with a ``WATCHDOG_`` env
fallback; detectors receive the frozen ``DetectorConfig`` at construction and
never read flags or the environment themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from watchdog import flags, jobtoken, logs, webconfig
from watchdog.coordinator import event_loops
from watchdog.coordinator.policy_file import Policy, load_policy
from watchdog.coordinator.vocabularies import ACTIONS
from watchdog.flags import (
    Flag,
    boolean,
    listen_address,
    non_negative_float,
    positive_float,
    positive_int,
)


def _non_negative_int(text: str) -> int:
    val = int(text)
    if val < 0:
        raise ValueError("must be >= 0")
    return val


def _share(text: str) -> float:
    val = float(text)
    if not 0 < val < 1:
        raise ValueError("must be between 0 and 1 (exclusive)")
    return val


def _factor(text: str) -> float:
    val = float(text)
    if not val >= 1:
        raise ValueError("must be >= 1 (a slowdown factor)")
    return val


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds. Defaults are tuned for 0.05-1 s steps, reports every ~1 s and a
    0.5 s hook heartbeat; see each detector's module for the reasoning."""

    # dead_rank: a host whose agent is silent this many of its report intervals is lost.
    host_silence_intervals: float = 5.0
    # frozen_rank: process alive, heartbeat (as the agent saw it) older than this.
    frozen_heartbeat_s: float = 3.0
    # collective_hang: deadline = max(floor, multiple x p99 step) + allowances.
    hang_floor_s: float = 5.0  # goal: a hang named within 10 s at 0.1-1 s steps (5 x p99 covers slower steps)
    hang_step_multiple: float = 5.0
    hang_phase_allowance_s: float = 120.0  # checkpoint / eval marked by the hook
    hang_warmup_allowance_s: float = 60.0  # init phase and a rank's first steps
    # straggler: compute (step - data - collective) vs the other ranks.
    straggler_window_steps: int = 20
    straggler_windows: int = 4
    straggler_factor: float = 1.034  # the threshold on a quiet job
    # Raised on noisy jobs: this many x the job's own window-to-window noise. The score is
    # tested on every window close, so its tail matters: at 4.0, 24 of 1,200 simulated healthy
    # jobs of 5,000 steps whose steps paused at random named a rank, at 4.5 one (benchmarks/straggler_false.py).
    straggler_sigmas: float = 4.5
    straggler_window_factor: float = 1.0  # every single window (sustained: slower in each)
    # never_joined: after the first rank registered.
    join_deadline_s: float = 60.0
    # loader_starvation
    starvation_share: float = 0.2
    starvation_window_steps: int = 50
    starvation_min_steps: int = 20
    # view: a rank's first steps (compile, warm-up, loader start) are not evidence.
    warmup_steps: int = 2
    # A rank's step samples kept (steps.StepStats.history). What reads them needs at
    # most ~100: the p99 (the last 100), the data share (the last 100, 50 trained),
    # the verdict (the last 50 trained), goodput (the steps since the last tick).
    # 256 were kept before step summaries (stepsummary.py): at 16,384 ranks they were
    # most of the coordinator's memory and of what its full collection walks
    # (2,048 ranks: 690,000 -> 425,000 tracked objects, 137 -> 88 MB). A rank silent
    # for longer than this many steps gives goodput only its newest ones (its
    # hook's 256-record ring drops more than that anyway).
    history_steps: int = 128

    def frozen_after_s(self, proc_status: str, starting: bool) -> float:
        """The heartbeat age past which a live rank is frozen. The OS saying "stopped"
        (SIGSTOP) shortens the wait; a debugger's or py-spy's brief stop does not
        outlast a third of it. A running rank's heartbeat late by less than the full
        threshold is a busy rank (a call that holds the GIL a while), not a freeze.

        A running rank ``starting`` (its hook counts no step yet) gets the
        warm-up allowance on top, as collective_hang gives init and the first steps:
        its imports hold the GIL while each extension module loads, and every rank of
        a job imports in the same seconds. On a loaded host the heartbeats of a
        healthy trl job's two ranks stopped together for 3.9 s before either stepped
        (fresh-clone run 8 of stop 54). Such a freeze is start-up, not a hang, until
        it outlasts the allowance; a stopped rank is stopped whenever it is."""
        if proc_status == "stopped":
            return self.frozen_heartbeat_s / 3
        return self.frozen_heartbeat_s + (self.hang_warmup_allowance_s if starting else 0.0)


@dataclass(frozen=True)
class Config:
    listen: tuple[str, int] = ("127.0.0.1", 19401)
    address_file: str = ""
    job: str = ""  # empty: adopt the first report's job
    run_id: str = ""  # this run of the job; another one's journal records are not its decisions (control/replay.py)
    world_size: int = 0  # 0: learn it from the reports
    token: str = field(default="", repr=False)
    journal: str = "watchdog-journal.jsonl"
    tick_s: float = 1.0
    resolve_grace_s: float = 2.0
    max_body_bytes: int = 4 << 20
    event_loop: str = "auto"  # the HTTP server's (event_loops.CHOICES)
    web_config: str = ""  # --web.config.file: TLS and basic auth (watchdog.webconfig)
    log_level: str = "info"
    log_format: str = "json"
    detectors: DetectorConfig = DetectorConfig()
    # When a finding opens, ask the agents for slot snapshots and Python stacks.
    evidence: bool = True
    commands_give_up_s: float = 60.0  # a command unanswered this long is journaled as expired
    stacks_max_per_host: int = 64  # at a hang: stacks asked per host (stack_plan.MAX_PER_HOST)
    # The bottleneck verdict every tick up to this many ranks, every ceil(ranks / this) ticks above (performance/cadence.py).
    performance_ranks_per_tick: int = 4096
    # Which finding earns which action (policy_file.py; control/policy.py acts on it); the default alerts only.
    policy: Policy = Policy()
    policy_file: str = ""


_D = DetectorConfig()

# Each flag names the DetectorConfig field it fills (flags.build): one table, so flags and config cannot drift.
DETECTOR_FLAGS: tuple[Flag, ...] = (
    Flag(
        "dead.host-silence-intervals",
        _D.host_silence_intervals,
        "a host whose agent sent nothing for this many of its report intervals is lost",
        positive_float,
        field="host_silence_intervals",
    ),
    Flag(
        "frozen.heartbeat-age-seconds",
        _D.frozen_heartbeat_s,
        "a live rank whose heartbeat is older than this is frozen",
        positive_float,
        field="frozen_heartbeat_s",
    ),
    Flag(
        "hang.floor-seconds",
        _D.hang_floor_s,
        "collective hang deadline: at least this long without progress",
        positive_float,
        field="hang_floor_s",
    ),
    Flag(
        "hang.step-multiple",
        _D.hang_step_multiple,
        "collective hang deadline: this many times the p99 recent step time",
        positive_float,
        field="hang_step_multiple",
    ),
    Flag(
        "hang.phase-allowance-seconds",
        _D.hang_phase_allowance_s,
        "extra deadline while a rank is in a checkpoint or eval phase",
        non_negative_float,
        field="hang_phase_allowance_s",
    ),
    Flag(
        "hang.warmup-allowance-seconds",
        _D.hang_warmup_allowance_s,
        "extra deadline during init and a rank's first steps; a running rank's frozen threshold before its first step",
        non_negative_float,
        field="hang_warmup_allowance_s",
    ),
    Flag(
        "straggler.window-steps",
        _D.straggler_window_steps,
        "steps per straggler window",
        positive_int,
        field="straggler_window_steps",
    ),
    Flag(
        "straggler.windows",
        _D.straggler_windows,
        "consecutive windows a straggler must be slow in",
        positive_int,
        field="straggler_windows",
    ),
    Flag(
        "straggler.factor",
        _D.straggler_factor,
        "smallest compute slowdown vs the median of the other ranks ever reported",
        _factor,
        field="straggler_factor",
    ),
    Flag(
        "straggler.sigmas",
        _D.straggler_sigmas,
        "slowdown must exceed the job's own noise by this many standard deviations",
        positive_float,
        field="straggler_sigmas",
    ),
    Flag(
        "straggler.window-factor",
        _D.straggler_window_factor,
        "slowdown every single window must show",
        _factor,
        field="straggler_window_factor",
    ),
    Flag(
        "join.deadline-seconds",
        _D.join_deadline_s,
        "ranks must register and finish process-group init this long after the first one registered",
        positive_float,
        field="join_deadline_s",
    ),
    Flag(
        "starvation.data-share",
        _D.starvation_share,
        "share of step time waiting on data that counts as starving",
        _share,
        field="starvation_share",
    ),
    Flag(
        "starvation.window-steps",
        _D.starvation_window_steps,
        "steps the data share is measured over",
        positive_int,
        field="starvation_window_steps",
    ),
    Flag(
        "starvation.min-steps",
        _D.starvation_min_steps,
        "steps needed before starvation is judged",
        positive_int,
        field="starvation_min_steps",
    ),
    Flag(
        "view.warmup-steps",
        _D.warmup_steps,
        "a rank's first steps after (re)start that are ignored as evidence",
        _non_negative_int,
        field="warmup_steps",
    ),
)

# DetectorConfig fields no flag sets (the view's memory, not a threshold to tune).
DETECTOR_NOT_FROM_FLAGS = ("history_steps",)

# Each flag names the Config field it fills; the two token flags both feed Config.token.
CONFIG_FLAGS: tuple[Flag, ...] = (
    Flag(
        "web.listen-address",
        "127.0.0.1:19401",
        "HOST:PORT for reports, /metrics and the status API",
        listen_address,
        field="listen",
    ),
    Flag(
        "web.address-file", "", "write the bound HOST:PORT here once listening (port 0 picks one)", field="address_file"
    ),
    webconfig.flag(),
    Flag(
        "web.max-body-bytes",
        4 << 20,
        "reports larger than this are refused (413)",
        positive_int,
        field="max_body_bytes",
    ),
    Flag(
        "web.event-loop",
        "auto",
        "the HTTP server's event loop: uvloop (C; about half the server's CPU per report), asyncio "
        "(the stdlib's), or auto (uvloop where installed)",
        event_loops.parse,
        field="event_loop",
    ),
    Flag(
        flags.JOB_NAME,
        "",
        "job name reports must carry (empty: the first report's)",
        field="job",
        old_env=flags.OLD_ENV[flags.JOB_NAME],
    ),
    Flag(
        "job.run-id",
        "",
        "this run of the job (e.g. $SLURM_JOB_ID): started again with the same one, the coordinator carries on "
        "the run's decisions from the journal; with another, it decides afresh (restart budget, job state); "
        "empty: every run in the journal is one",
        field="run_id",
    ),
    Flag(
        "job.world-size", 0, "expected number of ranks (0: learn from reports)", _non_negative_int, field="world_size"
    ),
    jobtoken.inline_flag("shared secret agents send as 'Authorization: Bearer'"),
    jobtoken.file_flag(f"file holding the job token (wins over --{jobtoken.INLINE})"),
    Flag("journal", "watchdog-journal.jsonl", "append-only JSONL journal of events and findings", field="journal"),
    Flag("tick.interval-seconds", 1.0, "how often the detectors run", positive_float, field="tick_s"),
    Flag(
        "findings.resolve-grace-seconds",
        2.0,
        "a finding is resolved after its condition is gone this long",
        non_negative_float,
        field="resolve_grace_s",
    ),
    logs.level_flag(),
    logs.format_flag(),
    Flag(
        "evidence.collect",
        True,
        "when a finding opens, ask the agents for slot snapshots and Python stacks (py-spy) of the ranks it concerns",
        boolean,
        field="evidence",
    ),
    Flag(
        "commands.give-up-seconds",
        60.0,
        "a command an agent has not answered this long is journaled as expired",
        positive_float,
        field="commands_give_up_s",
    ),
    Flag(
        "stacks.max-ranks-per-host",
        64,
        "at a hang every live rank's stack is asked for; at most this many per "
        "host (the rest is journaled as stacks_capped)",
        positive_int,
        field="stacks_max_per_host",
    ),
    Flag(
        "performance.ranks-per-tick",
        4096,
        "the bottleneck verdict runs every tick up to this many ranks, every ceil(ranks / this) "
        "ticks above (at 16,384 ranks: every 4th), never on a tick a finding opened on",
        positive_int,
        field="performance_ranks_per_tick",
    ),
    Flag(
        "policy.file",
        "",
        f"TOML policy: finding kind -> {'/'.join(ACTIONS)}, restart budget, cooldown, dry run (default: alert only)",
        field="policy_file",
    ),
)
# Config fields from_values derives: the thresholds (from DETECTOR_FLAGS) and the policy the file holds.
CONFIG_NOT_FROM_FLAGS = ("detectors", "policy")

FLAGS: tuple[Flag, ...] = (*CONFIG_FLAGS, *DETECTOR_FLAGS)


def from_values(values: Mapping[str, Any]) -> Config:
    """Build the config from ``flags.parse`` output. The token file is read here:
    an unreadable or empty one is a FlagError (``watchdog.jobtoken``)."""
    det = flags.build(DetectorConfig, DETECTOR_FLAGS, values)
    if det.starvation_min_steps > det.starvation_window_steps:
        raise ValueError("--starvation.min-steps must not exceed --starvation.window-steps")
    cfg = flags.build(Config, CONFIG_FLAGS, values, token=jobtoken.read(values), detectors=det)
    # A PolicyError is a ValueError naming the file and the mistake: main exits with it.
    return replace(cfg, policy=load_policy(cfg.policy_file)) if cfg.policy_file else cfg


def loggable(cfg: Config) -> dict[str, Any]:
    """The effective config, secrets masked: logged and journaled at start."""
    out = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in ("token", "detectors")}
    out["listen"] = f"{cfg.listen[0]}:{cfg.listen[1]}"
    out["token"] = "<set>" if cfg.token else "<unset>"
    out["detectors"] = {f.name: getattr(cfg.detectors, f.name) for f in fields(cfg.detectors)}
    out["policy"] = {
        f.name: (dict(getattr(cfg.policy, f.name)) if f.name == "actions" else getattr(cfg.policy, f.name))
        for f in fields(cfg.policy)
    }
    return out
