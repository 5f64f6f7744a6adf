"""The agent's side of the command channel: verify each command in a report
reply, run accepted ones on a worker thread, and leave the acks in the outbox for
the next reports.

Called by the sender thread with the job whose reply carried the commands; it
only verifies (microseconds) and enqueues, so reporting never waits for a dump.
The worker (``watchdog-agent-commands``, lazy, daemon) runs one command at a
time: dumps are rare, and serial dumps pause at most one rank at a time.

Refusals are counted by reason (``REFUSALS`` in ``watchdog.contracts.commands``), logged,
and acked to the coordinator (which journals them); nothing a coordinator or an
attacker sends can stop the agent.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from watchdog import logs
from watchdog.agent.command_channel.handlers import Actions, ack
from watchdog.agent.command_channel.outbox import Outbox
from watchdog.contracts import commands as c

MAX_PER_REPLY = 32
QUEUE_MAX = 32
RESULTS = ("ok", "failed")


class CommandHandler:
    def __init__(
        self,
        *,
        host: str,
        token: str,
        loopback: bool,
        actions: Actions,
        outbox: Outbox,
        wall: Callable[[], float] = time.time,
        log: Any = None,
        queue_max: int = QUEUE_MAX,
        token_of: Callable[[str], str] = lambda job: "",
    ) -> None:
        # token_of: a job's own token (discovery.Discovery), "" = ``token``
        self.host, self._token, self._loopback, self._token_of = host, token, loopback, token_of
        self._actions, self.outbox, self._wall = actions, outbox, wall
        self._log = log or logs.get("watchdog.agent.commands")
        self._seen = c.ReplayCache()
        # Every command this process may run answers a report it sent, so it was issued
        # (in this host's clock) after now: one issued earlier is a replay from before a
        # restart, which the in-memory cache above has forgotten.
        self.started_wall = wall()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_max)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.refused = dict.fromkeys(c.REFUSALS, 0)
        self.executed = {(t, r): 0 for t in c.TYPES for r in RESULTS}

    # -- the sender's seam -------------------------------------------------------

    def __call__(self, job: str, commands: list[Any]) -> None:
        if len(commands) > MAX_PER_REPLY:
            self._log.warning("commands dropped", job=job, received=len(commands), kept=MAX_PER_REPLY)
        for cmd in commands[:MAX_PER_REPLY]:
            try:
                self._receive(job, cmd)
            except Exception as exc:  # a bug on one command must not cost the others (or the report loop)
                self._log.error("command handling failed", job=job, error=repr(exc), exc_info=exc)

    def _receive(self, job: str, cmd: Any) -> None:
        now = self._wall()
        token = self._token_of(job) or self._token
        ok, reason = c.verify(
            cmd, token, job, self.host, now, self._seen, loopback=self._loopback, not_before=self.started_wall
        )
        if not ok:
            self._refuse(job, cmd, reason)
            return
        self._seen.add(cmd["id"], cmd["expires_wall"], now)
        self._log.info("command received", job=job, id=cmd["id"], type=cmd["type"], **_about(cmd))
        # The running ack first: the worker may finish before this thread runs again.
        self.outbox.put(job, {"id": cmd["id"], "type": cmd["type"], "running": True})
        try:
            self._queue.put_nowait((job, cmd))
        except queue.Full:
            self._done(job, cmd, ack(cmd, False, "agent busy: command queue full"))
            return
        self._ensure_worker()

    def _refuse(self, job: str, cmd: Any, reason: str) -> None:
        self._count_refused(reason)
        d = cmd if isinstance(cmd, dict) else {}
        cid, kind = d.get("id"), d.get("type")
        cid, kind = cid if isinstance(cid, str) else "", kind if isinstance(kind, str) else ""
        self._log.warning(
            "command refused", job=job, id=cid, type=kind, reason=reason, cmd_job=d.get("job"), cmd_host=d.get("host")
        )
        # Acked so the coordinator journals it too; a replay is not acked again
        # (the original's ack is the answer, and a flood must not fill the outbox).
        if cid and reason != c.REPLAYED:
            self.outbox.put(
                job, ack({"id": cid[: c.MAX_ID_LEN], "type": kind[:32]}, False, f"refused: {reason}", refused=reason)
            )

    def _count_refused(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    # -- the worker ----------------------------------------------------------------

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="watchdog-agent-commands", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._execute(*item)
            finally:
                self._queue.task_done()

    def _execute(self, job: str, cmd: dict) -> None:
        t0 = time.monotonic()
        try:
            result, refusals = self._actions.run(cmd)
        except Exception as exc:  # a bug in one command must not kill the worker
            self._log.error("command crashed", job=job, id=cmd["id"], type=cmd["type"], error=repr(exc), exc_info=exc)
            result, refusals = ack(cmd, False, f"agent error: {type(exc).__name__}: {exc}"), []
        for reason in refusals:
            self._count_refused(reason)
            self._log.warning("command refused", job=job, id=cmd["id"], type=cmd["type"], reason=reason)
        self._done(job, cmd, result, time.monotonic() - t0)

    def _done(self, job: str, cmd: dict, result: dict, duration_s: float = 0.0) -> None:
        with self._lock:
            key = (cmd["type"], "ok" if result["ok"] else "failed")
            self.executed[key] = self.executed.get(key, 0) + 1
        self._log.info(
            "command done",
            job=job,
            id=cmd["id"],
            type=cmd["type"],
            ok=result["ok"],
            error=result["error"][:300],
            duration_s=round(duration_s, 3),
            stacks=len(result["stacks"]),
            slots=len(result["slots"]),
        )
        self.outbox.put(job, result)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Let the command in progress finish (a dump has its own timeout), drop the rest."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
        self._queue.put(None)
        thread.join(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every accepted command has run (for tests and shutdown)."""
        q = self._queue
        with q.all_tasks_done:
            return q.all_tasks_done.wait_for(lambda: not q.unfinished_tasks, timeout_s)


def _about(cmd: dict) -> dict:
    if cmd["type"] in c.EVIDENCE:
        return {"ranks": [t["rank"] for t in cmd["args"]["ranks"]]}
    if cmd["type"] == c.CHECKPOINT:
        return {"ranks": [t["rank"] for t in cmd["args"]["ranks"]], "step": cmd["args"]["step"]}
    if cmd["type"] == c.ROLLBACK:
        return {"before_step": cmd["args"]["before_step"]}
    return {"target": cmd.get("target"), "signal": cmd["args"].get("signal")}
