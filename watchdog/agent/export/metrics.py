"""Every metric the agent exports, defined once. Names are an API: they are
golden-filed in tests/golden/agent_metrics.txt and linted with promtool.

Per-rank series carry the labels training_job, rank, local_rank, host, and there are
exactly 30 of them per rank (SERIES_PER_RANK, checked against a real exposition):

    alive, process_stopped, exited, heartbeat_age_seconds           4
    steps_total, step, step_age_seconds                            3
    last_step_seconds, window_step_seconds                         2
    last_step_part_seconds{part=data|collective|compute}           3
    step_part_seconds_total{part=data|collective|compute}          3
    phase{phase=train|init|checkpoint|eval|shutdown|other}         6  (one-hot)
    in_data_wait, in_collective, collective_seq,
    collective_age_seconds, pg_joined                              5
    collective_bytes_total                                         1
    hook_errors_total, cpu_seconds_total, resident_memory_bytes    3
                                                                  --
                                                                  30

and up to 8 more where the rank measures them (OPTIONAL_SPECS; absent, not 0,
elsewhere, so that most jobs pay no cardinality for them):

    batch_size                          the per-rank batch, once the hook knows it
    model_part_seconds_total{part=forward|backward|optimizer|h2d}
                                        the finer split (mon.watch_model, and
                                        wrap_loader(device=) for h2d), each part
                                        once measured
    gpu_step_part_seconds_total{clock=gpu,part=data|collective|compute}
                                        the split on the accelerator's clock, where
                                        the hook has a completion source (CUDA
                                        events): on NCCL the CPU side's collective
                                        wait reads ~0 and this one does not

The parts of a step add up to it: compute = step - data - collective (never
negative). There is no separate total-step-time counter: it is the sum over
``part`` of ``watchdog_rank_step_part_seconds_total``; a windowed mean per part is
``rate(..._part_seconds_total[5m]) / rate(watchdog_rank_steps_total[5m])``.

With ``--metrics.rank-detail=summary`` the per-rank series are exported only for
the ranks worth a look (every rank that is not alive and running, and the
``--metrics.slowest-ranks`` slowest by last step's compute); the host aggregates
below (HOST_SERIES per job and host) are exported at every detail level.

The training job is ``training_job``, never ``job``: ``job`` and ``instance`` are
Prometheus' own target labels (the scrape job), and a scraped ``job`` would either
be renamed ``exported_job`` or, with ``honor_labels: true``, overwrite the scrape
job on some series but not on others. Scrape without honor_labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from watchdog.contracts import slot as wire

RANK_LABELS = ("training_job", "rank", "local_rank", "host")
PARTS = ("data", "collective", "compute")
PHASES = tuple(p.label for p in wire.Phase)
GPU_LABELS = ("host", "gpu")


@dataclass(frozen=True)
class Spec:
    name: str  # full name; counters end in _total
    kind: str  # "gauge" | "counter"
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> CounterMetricFamily | GaugeMetricFamily:
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        return cls(self.name, self.help, labels=list(self.labels))


def _g(name: str, help: str, labels: tuple[str, ...] = ()) -> Spec:
    return Spec("watchdog_" + name, "gauge", help, labels)


def _c(name: str, help: str, labels: tuple[str, ...] = ()) -> Spec:
    return Spec("watchdog_" + name, "counter", help, labels)


R = RANK_LABELS
# -- per rank ------------------------------------------------------------------
RANK_ALIVE = _g("rank_alive", "1 if the rank's process (pid and start time) exists and is not a zombie.", R)
RANK_STOPPED = _g("rank_process_stopped", "1 if the rank's process is stopped (SIGSTOP, tracer).", R)
RANK_EXITED = _g("rank_exited", "1 if the rank's hook recorded a clean interpreter exit.", R)
RANK_HEARTBEAT_AGE = _g("rank_heartbeat_age_seconds", "Seconds since the hook's heartbeat thread last wrote.", R)
RANK_STEPS = _c("rank_steps_total", "Training steps completed by the rank.", R)
RANK_STEP = _g("rank_step", "Steps completed so far (the counter as a gauge, to compare ranks).", R)
RANK_STEP_AGE = _g("rank_step_age_seconds", "Seconds since the step in progress started.", R)
RANK_LAST_STEP = _g("rank_last_step_seconds", "Duration of the last completed step.", R)
RANK_WINDOW_STEP = _g("rank_window_step_seconds", "Mean step duration over the last 32 completed steps.", R)
RANK_LAST_PART = _g(
    "rank_last_step_part_seconds",
    "Last completed step split into data wait, collective wait and compute.",
    R + ("part",),
)
RANK_PART_TOTAL = _c(
    "rank_step_part_seconds_total",
    "Step time spent in data wait, collective wait and compute, summed over steps.",
    R + ("part",),
)
RANK_PHASE = _g("rank_phase", "1 for the phase the rank is in, 0 for the others.", R + ("phase",))
RANK_IN_DATA = _g("rank_in_data_wait", "1 while the rank waits on its data iterator.", R)
RANK_IN_COLL = _g("rank_in_collective", "1 while the rank has a collective outstanding.", R)
RANK_COLL_SEQ = _g("rank_collective_seq", "Sequence number of the last collective the rank entered.", R)
RANK_COLL_AGE = _g(
    "rank_collective_age_seconds", "Seconds inside the outstanding collective (0 when none is outstanding).", R
)
RANK_PG_JOINED = _g("rank_pg_joined", "1 once the rank finished init_process_group (and until destroyed).", R)
RANK_COLL_BYTES = _c(
    "rank_collective_bytes_total",
    "Bytes of the collectives the rank entered (input tensors), summed; per step: rate over rate of steps_total.",
    R,
)
RANK_BATCH = _g("rank_batch_size", "Samples per step on this rank (the wrapped loader's batch, or set).", R)
RANK_MODEL_PART = _c(
    "rank_model_part_seconds_total",
    "Finer split of compute summed over steps: forward, backward (with the gradient all-reduce wait), optimizer, "
    "host-to-device copy.",
    R + ("part",),
)
RANK_GPU_PART_TOTAL = _c(
    "rank_gpu_step_part_seconds_total",
    "Step time on the accelerator's clock (clock=gpu: between its step completions) split into data wait (the CPU "
    "side's), collective wait (GPU-side collective times) and compute, summed over the steps it finished.",
    R + ("clock", "part"),
)
RANK_HOOK_ERRORS = _c("rank_hook_errors_total", "Errors the rank's hook caught (never raised into training).", R)
RANK_CPU = _c("rank_cpu_seconds_total", "User plus system CPU time of the rank's process.", R)
RANK_RSS = _g("rank_resident_memory_bytes", "Resident memory of the rank's process.", R)

RANK_SPECS = (
    RANK_ALIVE,
    RANK_STOPPED,
    RANK_EXITED,
    RANK_HEARTBEAT_AGE,
    RANK_STEPS,
    RANK_STEP,
    RANK_STEP_AGE,
    RANK_LAST_STEP,
    RANK_WINDOW_STEP,
    RANK_LAST_PART,
    RANK_PART_TOTAL,
    RANK_PHASE,
    RANK_IN_DATA,
    RANK_IN_COLL,
    RANK_COLL_SEQ,
    RANK_COLL_AGE,
    RANK_PG_JOINED,
    RANK_COLL_BYTES,
    RANK_HOOK_ERRORS,
    RANK_CPU,
    RANK_RSS,
)
OPTIONAL_SPECS = (RANK_BATCH, RANK_MODEL_PART, RANK_GPU_PART_TOTAL)  # exported only where measured
MODEL_PARTS = wire.SPLIT_PARTS
_FANOUT = {"part": len(PARTS), "phase": len(PHASES)}
SERIES_PER_RANK = sum(_FANOUT.get(s.labels[-1], 1) for s in RANK_SPECS)

# -- per job on this host --------------------------------------------------------
JOB_WORLD_SIZE = _g(
    "job_world_size",
    "World size the job's newest ranks on this host declare (those whose process lives, if any).",
    ("training_job", "host"),
)

# Host-level aggregates of the per-rank series, exported at every detail level
# (--metrics.rank-detail): the scale recording rules and, at summary detail, the
# dashboards read these instead of 29 series per rank (HOST_SERIES per job and host).
H = ("training_job", "host")
HOST_RANKS = _g("host_ranks", "Ranks of the job on this host, by state (alive, stopped, dead, exited).", H + ("state",))
HOST_RANK_STATES = ("alive", "stopped", "dead", "exited")
HOST_STEPS = _c("host_steps_total", "Training steps completed, summed over the job's ranks on this host.", H)
HOST_PART_TOTAL = _c(
    "host_step_part_seconds_total",
    "Step time in data wait, collective wait and compute, summed over steps and the job's ranks on this host.",
    H + ("part",),
)
HOST_STEP_MIN = _g("host_step_min", "Steps completed by the job's least advanced rank on this host.", H)
HOST_STEP_MAX = _g("host_step_max", "Steps completed by the job's most advanced rank on this host.", H)
HOST_HEARTBEAT_AGE_MAX = _g(
    "host_heartbeat_age_max_seconds", "Oldest heartbeat among the job's live ranks on this host.", H
)
HOST_COLL_AGE_MAX = _g(
    "host_collective_age_max_seconds", "Longest time inside an outstanding collective among the job's ranks here.", H
)
HOST_LAST_COMPUTE_MAX = _g(
    "host_last_step_compute_max_seconds", "Compute time of the last step of the job's slowest rank on this host.", H
)
HOST_SPECS = (
    HOST_RANKS,
    HOST_STEPS,
    HOST_PART_TOTAL,
    HOST_STEP_MIN,
    HOST_STEP_MAX,
    HOST_HEARTBEAT_AGE_MAX,
    HOST_COLL_AGE_MAX,
    HOST_LAST_COMPUTE_MAX,
)
HOST_SERIES = len(HOST_RANK_STATES) + len(PARTS) + len(HOST_SPECS) - 2

# -- the agent -------------------------------------------------------------------
SLOT_READ_ERRORS = _c(
    "agent_slot_read_errors_total",
    "Slot files that entered an unreadable state, by reason (corrupt, version, torn, io).",
    ("reason",),
)
SLOTS = _g("agent_slots", "Slot files in the run directory by state.", ("state",))
POLLS = _c("agent_polls_total", "Polls of the run directory.")
POLL_DURATION = _g("agent_poll_duration_seconds", "Duration of the last poll.")
PROC_ERRORS = _c("agent_process_read_errors_total", "Rank processes that exist but could not be read.")
REPORTS = _c("agent_reports_total", "Reports sent to the coordinator, by result (ok, error).", ("result",))
REPORT_RANKS_DROPPED = _c(
    "agent_report_ranks_dropped_total",
    "Ranks left out of reports because their slot held out-of-range values (the rest is sent).",
)
REPORTS_UNADDRESSED = _c(
    "agent_reports_unaddressed_total",
    "Reports not sent: their job's coordinator is not known (--coordinator.url-from-run-dir and no believable "
    "<job>.coordinator file beside its slots; the log says why).",
)
STEP_SUMMARIES_OMITTED = _c(
    "agent_step_summaries_omitted_total",
    "Ranks' step summaries left out of reports as out of range (the coordinator computes those ranks' statistics).",
)
COMMANDS = _c("agent_commands_received_total", "Commands received from the coordinator.")
COMMANDS_REFUSED = _c(
    "agent_commands_refused_total",
    "Commands refused, by reason (bad signature, expired, replayed, wrong identity, ...).",
    ("reason",),
)
COMMANDS_EXECUTED = _c(
    "agent_commands_executed_total", "Commands run, by type and result (ok, failed).", ("type", "result")
)
AGENT_CPU = _c("agent_cpu_seconds_total", "User plus system CPU time of the agent itself.")
AGENT_RSS = _g("agent_resident_memory_bytes", "Resident memory of the agent itself.")
BUILD_INFO = _g("agent_build_info", "Always 1; labels carry the agent's version.", ("version", "python_version"))
COLLECTOR_SUCCESS = _g("collector_success", "1 if the collector's last run succeeded.", ("collector",))
COLLECTOR_DURATION = _g("collector_duration_seconds", "Duration of the collector's last run.", ("collector",))

# -- accelerators ----------------------------------------------------------------
ACCEL_AVAILABLE = _g("accelerator_available", "1 if NVML is usable on this host.")
ACCELERATORS = _g("accelerators", "Accelerators NVML reports on this host.")
ACCEL_INFO = _g("accelerator_info", "Always 1; labels name the device.", GPU_LABELS + ("name", "uuid"))
ACCEL_UTIL = _g("accelerator_utilization_ratio", "Share of the last sample period a kernel ran (0-1).", GPU_LABELS)
ACCEL_MEM_UTIL = _g(
    "accelerator_memory_utilization_ratio",
    "Share of the last sample period device memory was read or written (0-1).",
    GPU_LABELS,
)
ACCEL_MEM_USED = _g("accelerator_memory_used_bytes", "Device memory in use.", GPU_LABELS)
ACCEL_MEM_TOTAL = _g("accelerator_memory_total_bytes", "Device memory installed.", GPU_LABELS)
ACCEL_TEMP = _g("accelerator_temperature_celsius", "GPU core temperature.", GPU_LABELS)
ACCEL_POWER = _g("accelerator_power_watts", "Power draw.", GPU_LABELS)
ACCEL_SM_CLOCK = _g("accelerator_sm_clock_hertz", "Current SM clock.", GPU_LABELS)
ACCEL_THROTTLE = _g(
    "accelerator_throttle_reasons",
    "NVML clock event (throttle) reasons bitmask; 0 or 1 (GPU idle) is unthrottled.",
    GPU_LABELS,
)
ACCEL_XID = _c(
    "accelerator_xid_errors_total",
    'Critical XID error events seen since the agent started, by XID code (xid="none": supported, none yet).',
    GPU_LABELS + ("xid",),
)
# Which accelerator each rank runs on (its process in NVML's compute list): join with the
# accelerator series on (host, gpu): "rank 5 is slow and its GPU is throttling" is one query.
ACCEL_RANK_INFO = _g(
    "accelerator_rank_info",
    "Always 1; the rank whose process runs on this GPU.",
    ("training_job", "rank", "local_rank", "host", "gpu", "uuid"),
)
ACCEL_SPECS = (
    ACCEL_INFO,
    ACCEL_UTIL,
    ACCEL_MEM_UTIL,
    ACCEL_MEM_USED,
    ACCEL_MEM_TOTAL,
    ACCEL_TEMP,
    ACCEL_POWER,
    ACCEL_SM_CLOCK,
    ACCEL_THROTTLE,
    ACCEL_XID,
    ACCEL_RANK_INFO,
)
