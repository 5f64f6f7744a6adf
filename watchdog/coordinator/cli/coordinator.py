"""``watchdog coordinator``: parse flags, refuse unsafe set-ups, run the daemon
until SIGTERM/SIGINT. Exit codes: 0 stopped by a signal, 1 could not start
(port in use, journal not writable), 2 bad configuration."""

from __future__ import annotations

import ipaddress
import sys
import threading
from collections.abc import Sequence

import prometheus_client

from ... import flags, jobtoken, logs, webconfig
from ...stopsignal import stop_on_signals
from ..config import FLAGS, Config, from_values, loggable

SWITCH_INTERVAL_S = 0.02  # sys.setswitchinterval for the coordinator's process (main)
DESCRIPTION = "Per-job coordinator: folds agent reports into a cluster view, runs detectors, journals findings."


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve to anything: treat it as exposed


def check_exposure(cfg: Config) -> str | None:
    """The error to exit with, or None. Reports steer actions on the job, so
    anyone who can reach the port must prove they hold the job token."""
    if not cfg.token and not is_loopback(cfg.listen[0]):
        return (
            f"refusing to listen on {cfg.listen[0]}:{cfg.listen[1]} without a job token: anyone who can reach it "
            f"could feed fake reports. Set --{jobtoken.FILE} (or {jobtoken.INLINE_ENV}), or listen on 127.0.0.1."
        )
    return jobtoken.too_short(cfg.token, cfg.listen[0])


def check_policy_token(cfg: Config) -> str | None:
    """The error to exit with, or None. Agents refuse every signal and checkpoint
    command that is not signed with the job token (``no_token``), so a policy with
    destructive actions and no token would decide a restart and then watch it be
    refused every few seconds while the job stays hung: refuse it at start instead."""
    if cfg.token or cfg.policy.dry_run:
        return None
    destructive = sorted({a for a in cfg.policy.actions.values() if a != "alert"})
    if not destructive:
        return None
    return (
        f"refusing to start: policy {cfg.policy_file or '(inline)'} asks for {', '.join(destructive)}, but "
        f"there is no job token, and agents refuse every unsigned signal or checkpoint command (no_token): "
        f"the action could never be carried out. Set --{jobtoken.FILE} (or {jobtoken.INLINE_ENV}) for the "
        f"coordinator and the agents, or set dry_run = true in the policy's [limits]."
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        values = flags.parse("watchdog coordinator", DESCRIPTION, FLAGS, argv)
        cfg = from_values(values)
        web = webconfig.load(cfg.web_config)
    except (flags.FlagError, ValueError, OSError) as exc:
        print(f"watchdog coordinator: {exc}", file=sys.stderr)
        return 2
    logs.configure(cfg.log_level, cfg.log_format)
    log = logs.get("watchdog.coordinator")
    for warning in flags.deprecations(FLAGS):
        log.warning("deprecated_env", detail=warning)
    err = check_exposure(cfg) or check_policy_token(cfg)
    if err:
        log.error("refused", error=err)
        print(f"watchdog coordinator: {err}", file=sys.stderr)
        return 2
    if not cfg.token:
        log.warning("no_token", detail="accepting unauthenticated reports on a loopback address")
    readable = jobtoken.file_warning(values)
    if readable:
        log.warning("token_file_readable", detail=readable)
    log.info("config", **loggable(cfg))
    # client_python adds a ``<name>_created`` series beside every counter series. They
    # are not part of this API (the golden file leaves them out), no rule or dashboard
    # reads them, and at 16,384 ranks they are 18,432 of the exposition's ~53,000
    # series: the per-host culprit counters, at 0 for every host and kind from the
    # start. Left out, a scrape is about half the bytes and the time.
    prometheus_client.disable_created_metrics()
    # The tick thread and the request loop share the interpreter. At CPython's 5 ms
    # switch interval a 150 ms tick is cut into ~30 slices, and each switch refills
    # the caches with the other thread's hundreds of MB of state: at 16,384 ranks the
    # tick's wall p99 was 865-940 ms against 478-488 ms of its own CPU (two runs).
    # At 20 ms it was 489 ms (479 at 50 ms), with as many reports handled; a report
    # waits at most one slice longer, and the loop's lag stays under back-pressure's
    # calm mark (50 ms), which a 50 ms interval would not.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    from ..daemon import Daemon  # after the checks: a refused start opens no journal

    stop = threading.Event()
    reason = ["stopped"]

    def stopped_by(name: str) -> None:
        reason[0] = name

    # Before start(): it writes the address file, and a supervisor (or test) that reads it may send
    # SIGTERM at once; the default action would end the process without its stop record.
    stop_on_signals(stop, stopped_by)
    try:
        daemon = Daemon(cfg, own_process=True, web=web).start()
    except OSError as exc:
        log.error("start_failed", error=str(exc))
        print(f"watchdog coordinator: cannot start: {exc}", file=sys.stderr)
        return 1
    while not stop.wait(1.0):
        pass
    daemon.stop(reason[0])
    return 0
