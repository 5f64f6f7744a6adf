"""Sends one report per job per interval to the coordinator, from its own daemon
thread: a slow or dead coordinator must never stall the poll loop.

POST {url}/api/v1/report, JSON ``HostReport.to_dict()``, ``Authorization: Bearer
<job token>``. The reply is ``{"ok": true, "commands": [...]}``; commands go to the
``handle_commands(job, commands)`` seam (``watchdog.agent.command_channel.inbox``), and their
acks come back through ``outbox`` in the next reports. Step records and acks are
marked reported only once a report carrying them was accepted, so a failed send
does not lose them (up to the report's cap).

The first report is version 1 (an object per rank), which every coordinator
reads. Once a reply lists 2 in ``"report_versions"`` the next ones are version 2
(``watchdog.report.as_rows``: half the bytes, less of the coordinator's CPU per
report); a reply without it, or a report refused as unreadable (400), goes back
to version 1, so an older coordinator, or one restarted as an older version, is
never sent what it cannot read for more than one report. A send that failed for
any other reason (no answer, busy, timed out) keeps the version: falling back to
version 1 when the coordinator is overloaded would double its bytes and decoding
exactly then.

A reply's ``"step_summary_config"`` has the agent send its ranks' step statistics
beside their samples (``stepsummaries.py``), computed from the samples accepted.

A reply's ``"steps_interval_s"`` (a coordinator taking hundreds of reports a
second: ``coordinator.backpressure``) has the agent send its ranks' step samples
that often, in every report still their liveness and progress (heartbeat, step,
collective state, deaths): a report without samples costs the coordinator about
half as much. Samples wait in the slot's ring (they are not marked reported), so
none is lost, and they go at once when a rank died or exited (the steps before a
death are evidence) or when half the report's cap of them is waiting.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from watchdog import jobtoken, logs
from watchdog.agent.reporting import build as report
from watchdog.agent.reporting.stepsummaries import StepSummaries
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.report import MAX_STEPS_PER_RANK, REPORT_VERSION, ROWS_VERSION, as_rows, split_valid

REPORT_PATH = "/api/v1/report"
MAX_REPLY_BYTES = 1 << 20


class HttpRefused(RuntimeError):
    """The coordinator answered, with an HTTP status that is not success."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


UNREADABLE = 400  # what a coordinator answers a body it cannot parse (an older one, to version 2)


class JsonPoster:
    """POST JSON, return the decoded JSON reply, over one kept-alive connection (the
    coordinator speaks HTTP/1.1): no TCP handshake per report. http.client, not
    urllib: a fraction of the CPU per request, and no http_proxy picked up from the
    environment (agents talk to an in-cluster coordinator). Not thread-safe: one
    per sender thread."""

    _STALE = (http.client.RemoteDisconnected, http.client.CannotSendRequest, ConnectionResetError, BrokenPipeError)

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context``: for an https coordinator (its CA: ``--coordinator.ca-file``)."""
        self._ssl = ssl_context
        self._conn: http.client.HTTPConnection | None = None
        self._key: tuple | None = None

    def __call__(self, url: str, payload: dict, token: str, timeout_s: float) -> Any:
        u = urllib.parse.urlsplit(url)
        key = (u.scheme, u.hostname, u.port, timeout_s)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {jobtoken.bearer(token)}"  # never the token itself
        body = json.dumps(payload).encode()
        for attempt in (1, 2):
            fresh = self._conn is None or key != self._key
            if fresh:
                self.close()
                if u.scheme == "https":
                    self._conn = http.client.HTTPSConnection(
                        u.hostname or "", u.port, timeout=timeout_s, context=self._ssl
                    )
                else:
                    self._conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout_s)
                self._key = key
            conn = self._conn
            assert conn is not None
            try:
                conn.request("POST", u.path or "/", body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read(MAX_REPLY_BYTES + 1)
            except self._STALE:
                self.close()
                if fresh or attempt == 2:
                    raise
                continue  # the server dropped our idle connection: once more on a new one
            except BaseException:
                self.close()
                raise
            if resp.will_close or len(data) > MAX_REPLY_BYTES:
                self.close()
            break
        if resp.status >= 300:
            detail = data[:512].decode("utf-8", "replace").strip()
            raise HttpRefused(resp.status, f"HTTP {resp.status} from {url}: {detail or resp.reason}")
        if len(data) > MAX_REPLY_BYTES:
            raise RuntimeError(f"reply from {url} larger than {MAX_REPLY_BYTES} bytes")
        return json.loads(data)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_FIELDS: dict[type, tuple[str, ...]] = {}
_SCALARS = frozenset({int, float, str, bool, type(None)})


def plain(obj: Any) -> Any:
    """``dataclasses.asdict`` for JSON, without its deep copies and with the field
    names cached per class: the same document (tuples become lists) at a fraction
    of the CPU. A report carries ~100 dataclasses a second per job."""
    t = type(obj)
    if t in _SCALARS:
        return obj
    names = _FIELDS.get(t)
    if names is not None:
        return {n: plain(getattr(obj, n)) for n in names}
    if t is tuple or t is list:
        return [plain(x) for x in obj]
    if t is dict:
        return {k: plain(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj):
        _FIELDS[t] = tuple(f.name for f in dataclasses.fields(obj))
        return plain(obj)
    return obj


MAX_ADVISED_INTERVAL_S = 10.0  # a confused coordinator cannot silence an agent


def _advised(reply: dict) -> float:
    """The reply's back-pressure advice, bounded; 0 when absent or malformed."""
    val = reply.get("report_interval_s")
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0:
        return 0.0
    return min(float(val), MAX_ADVISED_INTERVAL_S)


MAX_STEPS_INTERVAL_S = 10.0  # samples held at most this long, whatever a reply says


def advised_steps(reply: dict) -> float:
    """The reply's advice on how often to send step samples, bounded; 0 when absent or malformed."""
    val = reply.get("steps_interval_s")
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0:
        return 0.0
    return min(float(val), MAX_STEPS_INTERVAL_S)


def steps_due_by_time(every: float, interval_s: float, last: float | None, now_s: float) -> bool:
    """Whether a report made at ``now_s`` carries step samples by the clock alone:
    always unless they are asked for less often (``every``) than reports go and a
    batch went at ``last``; then once ``every`` has passed, to the nearest report."""
    return every <= interval_s or last is None or now_s - last >= every - interval_s / 2


def first_batch_mark(now_s: float, every: float, interval_s: float, u: float) -> float:
    """The ``last`` for ``steps_due_by_time`` that makes the first batch due at
    ``now_s + u * every`` (``u`` in [0, 1): each agent's own point in the interval)."""
    return now_s + every * u - (every - interval_s / 2)


def reads_rows(reply: dict) -> bool:
    """Whether the reply says its coordinator reads version-2 reports."""
    versions = reply.get("report_versions")
    return isinstance(versions, list) and any(type(v) is int and v == ROWS_VERSION for v in versions)


def log_commands(job: str, commands: list[dict]) -> None:
    logs.get("watchdog.agent.sender").info("commands received", job=job, commands=commands)


class Sender:
    def __init__(
        self,
        *,
        url: str,
        token: str,
        job: str,
        host: str,
        agent_id: str,
        interval_s: float,
        timeout_s: float,
        views: Callable[[], Sequence[LocalRank]],
        replaced_deaths: Callable[[], Sequence[LocalRank]] = tuple,
        accelerators: Callable[[], list[dict]] = list,
        post: Callable | None = None,
        handle_commands: Callable[[str, list[dict]], None] = log_commands,
        outbox: Any = None,
        url_of: Callable[[str, Sequence[LocalRank]], str] | None = None,
        token_of: Callable[[str], str] = lambda job: "",
        log: Any = None,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        wall: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        read_age_s: Callable[[], float] | None = None,
        stale_read_s: float = 1.0,
    ) -> None:
        self._url, self._token, self._job, self._host = url + REPORT_PATH, token, job, host
        # Per job, where its coordinator is (discovery.Discovery); None: always ``url``.
        self._url_of, self._token_of = url_of, token_of  # a job's own token, "" = ``token``
        self.reports_unaddressed = 0  # not sent: the job's coordinator is not known (yet)
        # How long ago the poll loop last read the slots (None: not known). A report is made
        # from that reading with ages measured now: after the agent itself was stopped or
        # starved, its ranks would look frozen for as long as it was (their heartbeats read
        # before the gap, aged across it). Such a send waits for a fresh reading.
        self._read_age_s, self._stale_read_s = read_age_s, stale_read_s
        self.stale_skipped = 0
        self._agent_id, self._interval_s, self._timeout_s = agent_id, interval_s, timeout_s
        self._views, self._accelerators, self._post = views, accelerators, post or JsonPoster()
        self._replaced_deaths = replaced_deaths
        self._told_dead: set[str] = set()  # slot paths whose death a report carried
        self._handle_commands, self._outbox = handle_commands, outbox
        self._log = log or logs.get("watchdog.agent.sender")
        self._mono_ns, self._wall, self._rand = mono_ns, wall, rand
        self._limit = logs.RateLimited(60.0)
        self._seq: dict[str, int] = {}
        self._since: dict[str, report.Mark] = {}
        # The marks after the last accepted report, with step samples or not: where collective records start.
        self._colls_since: dict[str, report.Mark] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        # Back-pressure: the interval the coordinator last asked for (its reply's
        # "report_interval_s"); reports go at the longer of it and our own.
        self.advised_interval_s = 0.0
        # How often to send step samples (the reply's "steps_interval_s"; 0: in every
        # report), and when a report carrying them was last accepted, per job.
        self.steps_interval_s = 0.0
        self._steps_sent: dict[str, float] = {}
        self.reports_without_steps = 0
        # The report version to send: 2 only while the last reply said it is read.
        self.report_version = REPORT_VERSION
        # Its ranks' step statistics, sent once a reply gives the settings (stepsummaries.py).
        self.summaries = StepSummaries()
        self.ok = self.failed = self.commands_received = self.ranks_dropped = 0
        self.last_commands: list[dict] = []

    def send_once(self) -> None:
        if self._read_age_s is not None and self._read_age_s() > self._stale_read_s:
            self.stale_skipped += 1
            return  # the next send, after the poll loop has read the slots again
        views = self._with_untold_deaths(tuple(self._views()))
        live_paths = {v.path for v in views}
        self._since = {p: i for p, i in self._since.items() if p in live_paths}
        self._colls_since = {p: i for p, i in self._colls_since.items() if p in live_paths}
        acc = self._accelerators()
        for job in [self._job] if self._job else report.jobs(views):
            mine = [v for v in views if v.identity.job == job]
            url = self._url
            if self._url_of is not None:
                base = self._url_of(job, mine)
                if not base:
                    self.reports_unaddressed += 1
                    continue
                url = base + REPORT_PATH
            seq = self._seq[job] = self._seq.get(job, 0) + 1  # per attempt: gaps show lost reports
            acks = self._outbox.take(job) if self._outbox is not None else []
            now_s = self._mono_ns() / 1e9
            steps = self._steps_due(job, mine, now_s)
            rep = report.build_report(
                job,
                self._host,
                self._agent_id,
                seq,
                mine,
                self._mono_ns(),
                self._wall(),
                self.interval_s,
                since=self._since,
                accelerators=acc,
                acks=acks,
                steps=steps,
                colls_since=self._colls_since,
            )
            rep = self.summaries.add(self._drop_invalid(rep, mine))
            body = plain(rep)
            try:
                if self.report_version == ROWS_VERSION:
                    body = as_rows(body)
                reply = self._post(url, body, self._token_of(job) or self._token, self._timeout_s)
                if not isinstance(reply, dict) or reply.get("ok") is not True:
                    raise RuntimeError(f"coordinator did not accept the report: {str(reply)[:200]}")
            except Exception as exc:  # URLError, timeout, bad JSON, refusal: all one outcome
                if isinstance(exc, HttpRefused) and exc.status == UNREADABLE:
                    self.report_version = REPORT_VERSION  # what any coordinator reads, until a reply says more
                self.summaries.failed()
                self._failed(job, exc, url)
                continue
            self.ok += 1
            self.report_version = ROWS_VERSION if reads_rows(reply) else REPORT_VERSION
            self.summaries.accepted(job, reply)
            if self._failing:
                self._failing = False
                self._log.info("reports resumed", url=url)
            delivered = report.marks(mine)
            self._colls_since.update(delivered)
            if steps:
                self._since.update(delivered)
                self._steps_sent[job] = now_s
            else:  # its samples go in a later report
                self.reports_without_steps += 1
            self._told_dead.update(v.path for v in mine if v.state == slot_states.DEAD)
            self.advised_interval_s = _advised(reply)
            self._follow_steps_advice(job, advised_steps(reply), now_s)
            if acks:
                self._outbox.delivered(job, acks)
            commands = reply.get("commands") or []
            if isinstance(commands, list) and commands:
                self.commands_received += len(commands)
                self.last_commands = commands
                self._handle_commands(job, commands)

    def _follow_steps_advice(self, job: str, every: float, now_s: float) -> None:
        """Take the reply's step-sample interval. When it first comes, the first batch
        goes at a random point within it: every agent gets the advice in the same
        second, and batches sent in step would bring all the samples in one second
        of every few, the coordinator's work with them."""
        if every and not self.steps_interval_s:
            self._steps_sent[job] = first_batch_mark(now_s, every, self.interval_s, self._rand())
        self.steps_interval_s = every

    def _steps_due(self, job: str, mine: Sequence[LocalRank], now_s: float) -> bool:
        """Whether this report carries its ranks' step samples: unless the coordinator
        asked for them less often than reports go and one carrying them was accepted
        recently, and no rank that died or exited has samples waiting (its last
        steps are evidence) nor any rank half a report's cap of them."""
        if steps_due_by_time(self.steps_interval_s, self.interval_s, self._steps_sent.get(job), now_s):
            return True
        for v in mine:
            waiting = report.pending_steps(v, self._since.get(v.path, 0))
            if waiting > MAX_STEPS_PER_RANK // 2 or (waiting and v.state != slot_states.ALIVE):
                return True
        return False

    def _with_untold_deaths(self, views: tuple[LocalRank, ...]) -> tuple[LocalRank, ...]:
        """``views``, with a replaced incarnation's death standing in for its successor
        until a report has carried it: the coordinator names a dead rank from the
        death it sees (which rank died first, and of what), and a group that
        torchrun restarted between two reports would otherwise show none."""
        deaths = tuple(self._replaced_deaths())
        # forget what is no longer tracked; a death told while its rank was current stays told
        self._told_dead &= {v.path for v in views} | {d.path for d in deaths}
        untold: dict[tuple[str, int], LocalRank] = {}
        for d in deaths:
            key = (d.identity.job, d.identity.rank)
            if d.path not in self._told_dead and (
                key not in untold or d.header.created_wall_ns > untold[key].header.created_wall_ns
            ):
                untold[key] = d
        if not untold:
            return views
        return tuple(untold.get((v.identity.job, v.identity.rank), v) for v in views)

    def _drop_invalid(self, rep: Any, views: Sequence[LocalRank]) -> Any:
        """A slot with out-of-range values (corrupt or forged) costs its own rank,
        never the host's report: the coordinator would refuse the whole report and
        soon call the host lost. Counted, and named in the log (once a minute each)."""
        good, bad = split_valid(rep.ranks)
        if not bad:
            return rep
        self.ranks_dropped += len(bad)
        paths = {(v.identity.rank, v.identity.pid): v.path for v in views}
        for r, why in bad:
            ok, suppressed = self._limit.should_log(f"drop:{rep.job}:{r.rank}:{r.pid}", time.monotonic())
            if ok:
                self._log.warning(
                    "rank dropped from report",
                    job=rep.job,
                    rank=r.rank,
                    pid=r.pid,
                    reason=why,
                    path=paths.get((r.rank, r.pid), ""),
                    suppressed=suppressed,
                )
        return dataclasses.replace(rep, ranks=good)

    def _failed(self, job: str, exc: BaseException, url: str) -> None:
        self.failed += 1
        self._failing = True
        ok, suppressed = self._limit.should_log("report", time.monotonic())
        if ok:
            self._log.warning(
                "report failed", url=url, job=job, error=f"{type(exc).__name__}: {exc}", suppressed=suppressed
            )

    @property
    def interval_s(self) -> float:
        """The interval in effect: ours, or longer while the coordinator is behind."""
        return max(self._interval_s, self.advised_interval_s)

    def _run(self) -> None:
        # Start-up jitter: 2,048 agents started together must not report in the same
        # millisecond, every second, for the rest of the job.
        if self._stop.wait(random.uniform(0.0, self._interval_s)):
            return
        deadline = self._mono_ns()
        while not self._stop.is_set():
            try:
                self.send_once()
            except Exception as exc:  # a bug here must not kill reporting for good
                self._log.error("report loop error", error=repr(exc), exc_info=exc)
            now = self._mono_ns()
            interval_ns = int(self.interval_s * 1e9)
            deadline += interval_ns
            if deadline < now:  # a send took longer than the interval: do not burst to catch up
                deadline = now + interval_ns
            deadline = self._sleep_until(deadline)

    def _sleep_until(self, deadline_ns: int) -> int:
        """Wait for the next report, due at ``deadline_ns``; returns when it goes.
        While the coordinator has slowed us down, look every interval of our own
        whether a rank died: a death goes out at our own pace. Slowing down is
        meant to spare the coordinator routine reports, not to find a dead rank
        ten seconds late (and one report more per death costs it nothing)."""
        own_ns = max(1, int(self._interval_s * 1e9))
        while True:
            now = self._mono_ns()
            if now >= deadline_ns or self._stop.wait(min(deadline_ns - now, own_ns) / 1e9):
                return deadline_ns
            if self.advised_interval_s > self._interval_s and self._untold_death():
                return min(deadline_ns, self._mono_ns())

    def _untold_death(self) -> bool:
        return any(v.state == slot_states.DEAD and v.path not in self._told_dead for v in self._views()) or any(
            d.path not in self._told_dead for d in self._replaced_deaths()
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="watchdog-agent-sender", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if isinstance(self._post, JsonPoster) and not (self._thread and self._thread.is_alive()):
            self._post.close()
