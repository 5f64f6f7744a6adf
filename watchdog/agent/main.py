"""``watchdog agent``: wires the pieces together and runs the poll loop, the only
place that reads the clock. Threads: main = poll loop, watchdog-agent-http =
/metrics, watchdog-agent-sender = reports (only with --coordinator.url),
watchdog-agent-commands = commands from the coordinator (started on the first).

Import this module without torch: nothing here or below imports it.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector

from watchdog import jobtoken, logs, webconfig
from watchdog.agent import config
from watchdog.agent.command_channel.handlers import Actions
from watchdog.agent.command_channel.inbox import CommandHandler
from watchdog.agent.command_channel.outbox import Outbox
from watchdog.agent.command_channel.stacks import StackDumper, find_py_spy
from watchdog.agent.export.accelmetrics import AcceleratorCollector
from watchdog.agent.export.agentmetrics import AgentCollector, LoopStats
from watchdog.agent.export.exporter import Exporter
from watchdog.agent.export.nvml import Accelerators, Disabled
from watchdog.agent.export.rankmetrics import RanksCollector
from watchdog.agent.reporting.discovery import Discovery
from watchdog.agent.reporting.sender import JsonPoster, Sender
from watchdog.agent.server import Server
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.contracts.commands import is_loopback
from watchdog.flags import FlagError
from watchdog.stopsignal import stop_on_signals


class Agent:
    def __init__(
        self,
        cfg: config.AgentConfig,
        *,
        tracker: SlotTracker | None = None,
        accelerators: Accelerators | Disabled | None = None,
        handle_commands: Callable[[str, list[dict]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.log = logs.get("watchdog.agent")
        self.tracker = tracker or SlotTracker(
            cfg.run_dir,
            job=cfg.job,
            stale_after_s=cfg.stale_after_s,
            job_expiry_s=cfg.job_expiry_s,
            trusted_uids=cfg.trusted_uids,
            resource_interval_s=min(1.0, cfg.report_interval_s),
        )
        self.accelerators = accelerators or (Accelerators() if cfg.accelerator else Disabled())
        self.loop = LoopStats()
        self.agent_id = secrets.token_hex(8)
        self.web = webconfig.load(cfg.web_config)  # a WebConfigError: main exits 2 with it
        self.sender = self.commands = None
        if cfg.coordinator_url or cfg.coordinator_from_run_dir:
            outbox = Outbox(log=self.log)
            discovery = Discovery(cfg.run_dir) if cfg.coordinator_from_run_dir else None
            token_of = discovery.token_of if discovery else lambda job: ""
            if handle_commands is None:
                # "" when not found: None would make the dumper search again and, for a --stacks.py-spy path that
                # does not exist, quietly run another py-spy than the one configured (and warned about below).
                dumper = StackDumper(find_py_spy(cfg.py_spy) or "", timeout_s=cfg.stacks_timeout_s)
                self.commands = CommandHandler(
                    host=cfg.host,
                    token=cfg.token,
                    outbox=outbox,
                    loopback=is_loopback(urllib.parse.urlsplit(cfg.coordinator_url).hostname),
                    token_of=token_of,
                    actions=Actions(
                        cfg.host,
                        self.tracker.incarnations,
                        dumper,
                        run_dir=cfg.run_dir,
                        dump_parallel=cfg.stacks_parallel,
                        dump_deadline_s=cfg.stacks_host_deadline_s,
                    ),
                )
                handle_commands = self.commands
            self.sender = Sender(
                url=cfg.coordinator_url,
                token=cfg.token,
                job=cfg.job,
                host=cfg.host,
                agent_id=self.agent_id,
                interval_s=cfg.report_interval_s,
                timeout_s=cfg.report_timeout_s,
                views=self.tracker.views,
                replaced_deaths=self.tracker.replaced_deaths,
                accelerators=self.accelerator_dicts,
                handle_commands=handle_commands,
                outbox=outbox,
                url_of=discovery,
                token_of=token_of,
                # used for https coordinators only (a discovered one may be too): the system's CAs or the CA file
                post=JsonPoster(webconfig.client_context(cfg.coordinator_ca_file)),
                read_age_s=lambda: (time.monotonic_ns() - self._last_poll_ns) / 1e9,
                stale_read_s=max(1.0, 10 * cfg.poll_interval_s),
            )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            Exporter(
                (
                    RanksCollector(self.tracker.views, cfg.host, detail=cfg.rank_detail, slowest=cfg.slowest_ranks),
                    AgentCollector(self.tracker, self.loop, self.sender, commands=self.commands),
                    AcceleratorCollector(self.accelerators, cfg.host, ranks=self.tracker.views),
                )
            )
        )
        self._last_poll_ns = 0
        self._errors = logs.RateLimited(60.0)

    def accelerator_dicts(self) -> list[dict]:
        """Devices for the report, each with the ranks whose process runs on it (by
        the ranks' pids in this agent's namespace, which NVML's lists use on a host)."""
        devices = self.accelerators.sample(time.monotonic()).devices
        if not devices:
            return []
        rank_of = {v.pid_here: v.identity.rank for v in self.tracker.views()}
        return [{**d.to_dict(), "ranks": sorted(rank_of[p] for p in d.pids if p in rank_of)} for d in devices]

    def healthy(self) -> tuple[bool, str]:
        """Unhealthy when the poll loop has not completed a poll for a while (stuck)."""
        limit_ns = max(2.0, 20 * self.cfg.poll_interval_s) * 1e9
        age_ns = time.monotonic_ns() - self._last_poll_ns
        if self._last_poll_ns and age_ns <= limit_ns:
            return True, "ok"
        return False, f"no poll completed for {age_ns / 1e9:.1f}s"

    def poll_once(self) -> None:
        t0 = time.monotonic_ns()
        try:
            self.tracker.poll(t0, time.time_ns())
        except Exception as exc:  # a bug must not stop monitoring: log (rate-limited) and poll again
            ok, suppressed = self._errors.should_log("poll", time.monotonic())
            if ok:
                self.log.error("poll failed", error=repr(exc), suppressed=suppressed, exc_info=exc)
        t1 = time.monotonic_ns()
        self._last_poll_ns = t1
        self.loop.last_poll_s = (t1 - t0) / 1e9

    def run(self, stop: threading.Event) -> int:
        try:
            server = Server(self.cfg.listen, self.registry, self.healthy, web=self.web)
        except OSError as exc:
            self.log.error("cannot listen", address=f"{self.cfg.listen[0]}:{self.cfg.listen[1]}", error=str(exc))
            return 1
        self.poll_once()  # /metrics has ranks from the first scrape on
        self.accelerators.sample(time.monotonic())  # "no accelerator" is said once, at start
        server.start(self.cfg.address_file)
        if self.sender:
            self.sender.start()
        interval_ns = int(self.cfg.poll_interval_s * 1e9)
        deadline = time.monotonic_ns()
        try:
            while not stop.is_set():
                now = time.monotonic_ns()
                deadline += interval_ns
                if deadline < now:  # fell behind (suspended, overloaded): skip, don't burst
                    deadline = now + interval_ns
                if stop.wait((deadline - now) / 1e9):
                    break
                self.poll_once()
        finally:
            self.log.info("stopping")
            if self.sender:
                self.sender.stop()
            if self.commands:
                self.commands.stop()
            server.stop()
            self.accelerators.close()
            self.tracker.procs.close()
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = config.load(sys.argv[1:] if argv is None else list(argv))
    except FlagError as exc:
        print(f"watchdog agent: {exc}", file=sys.stderr)
        return 2
    logs.configure(cfg.log_level, cfg.log_format)
    log = logs.get("watchdog.agent")
    for warning in cfg.deprecations:
        log.warning("deprecated variable", detail=warning)
    log.info(
        "config", **{**cfg.effective, "host.name": cfg.host, "web.listen-address": f"{cfg.listen[0]}:{cfg.listen[1]}"}
    )
    if (cfg.coordinator_url or cfg.coordinator_from_run_dir) and not find_py_spy(cfg.py_spy):
        log.warning(
            "py-spy not found: stack dumps requested by the coordinator will fail "
            "(pip install py-spy, or --stacks.py-spy PATH)",
            **{"stacks.py-spy": cfg.py_spy},
        )
    if cfg.token_warning:
        log.warning("token file readable by every user", detail=cfg.token_warning)
    if cfg.token_from_argv:
        log.warning(
            f"job token given with --{jobtoken.INLINE} is visible to every local user; "
            f"use --{jobtoken.FILE} or {jobtoken.INLINE_ENV}"
        )
    try:
        agent = Agent(cfg)
    except webconfig.WebConfigError as exc:
        print(f"watchdog agent: {exc}", file=sys.stderr)
        return 2
    # The standard process_* series (CPU, memory, fds, start time) of this process:
    # registered here, where the agent is the whole process, never in Agent (tests run several in one).
    ProcessCollector(registry=agent.registry)
    stop = threading.Event()

    stop_on_signals(stop, lambda name: log.info("signal", signal=name))
    return agent.run(stop)
