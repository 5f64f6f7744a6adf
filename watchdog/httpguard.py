"""A stdlib ``ThreadingHTTPServer`` that unauthenticated clients cannot exhaust.

The stdlib server starts one thread per connection with no cap, its socket
timeout is per read (a client sending a byte every few seconds holds a thread
for ever), its accept loop spins at 100% CPU once the process runs out of file
descriptors (accept fails, the listening socket stays readable), and it prints
a traceback to stderr for every client that disconnects mid-reply (a flood of
them fills the log). ``GuardedServer`` fixes the four:

* at most ``max_connections`` connections are served at once. At the cap a new
  connection takes the place of the one that has waited longest for a request
  without sending a byte of it (``evicted_idle``): sockets held open and silent
  cannot keep a scrape or a probe out. Only when every connection is inside a
  request is one more answered 503 and closed at once, without a thread;
* every request has a total deadline (``request_deadline_s``, from when the
  server starts waiting for it -- the accept, for a connection's first -- to when
  the reply is written): a reaper thread shuts the socket of a request past it,
  whatever the client trickles, and of a connection that never sends a byte;
* an accept that fails for lack of descriptors or memory pauses the accept loop
  briefly (the connections being served free theirs) instead of spinning;
* client disconnects and resets are counted and logged once a minute; other
  handler errors are logged (rate-limited) with their traceback.

Handlers opt into the per-request deadline by inheriting ``GuardedHandler``.
"""

from __future__ import annotations

import errno
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from watchdog import logs

MAX_CONNECTIONS = 256
REQUEST_DEADLINE_S = 30.0
LISTEN_BACKLOG = 128
ACCEPT_PAUSE_S = 0.1
EVICT_WAIT_S = 1.0  # for the evicted connection's thread to end and give its place back
RESERVE_FDS = 256  # descriptors a daemon needs besides its connections (journal, files, sockets out)
OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"


class GuardedServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    max_connections = MAX_CONNECTIONS
    request_deadline_s = REQUEST_DEADLINE_S
    log_name = "watchdog.http"

    def __init__(
        self,
        address: Any,
        handler: Any,
        *,
        max_connections: int | None = None,
        request_deadline_s: float | None = None,
        log_name: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_connections is not None:
            self.max_connections = max_connections
        if request_deadline_s is not None:
            self.request_deadline_s = request_deadline_s
        self._sleep = sleep
        self._log = logs.get(log_name or self.log_name)
        self.max_connections = fit_fd_limit(self.max_connections, self._log)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._deadlines: dict[socket.socket, float] = {}
        self._waiting: dict[socket.socket, float] = {}  # connections waiting for a request's first byte: since
        self._dl_lock = threading.Lock()
        self._closing = threading.Event()
        self._limit = logs.RateLimited(every_s=60.0)
        # Counters (plain ints, read by tests and metrics).
        self.refused_busy = self.deadline_closed = self.client_errors = self.handler_errors = self.accept_errors = 0
        self.evicted_idle = 0
        super().__init__(address, handler)
        self._reaper = threading.Thread(target=self._reap, name="watchdog-http-deadlines", daemon=True)
        self._reaper.start()

    # -- connection cap ----------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False) and not (
            self._evict_idle() and self._slots.acquire(timeout=EVICT_WAIT_S)
        ):
            refuse_busy(self, request, client_address[0])
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.disarm(request)
            self._slots.release()

    def _evict_idle(self) -> bool:
        """Shut the connection that has waited longest for a request's first byte;
        its thread ends and gives its place back. False when none is waiting."""
        with self._dl_lock:
            if not self._waiting:
                return False
            victim = min(self._waiting, key=self._waiting.__getitem__)
            del self._waiting[victim]
        self.evicted_idle += 1
        self.log_once(
            "evict",
            "idle connection closed: the connection cap was reached and a new client came",
            max_connections=self.max_connections,
            evicted=self.evicted_idle,
        )
        try:
            victim.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def waiting(self, sock: socket.socket, on: bool) -> None:
        """``sock`` waits for a request's first byte (``on``), or no longer does."""
        with self._dl_lock:
            if on:
                self._waiting[sock] = time.monotonic()
            else:
                self._waiting.pop(sock, None)

    # -- per-request deadline --------------------------------------------------------

    def arm(self, sock: socket.socket) -> None:
        with self._dl_lock:
            self._deadlines[sock] = time.monotonic() + self.request_deadline_s

    def disarm(self, sock: socket.socket) -> None:
        with self._dl_lock:
            self._deadlines.pop(sock, None)

    def _reap(self) -> None:
        tick = max(0.05, min(1.0, self.request_deadline_s / 4))
        while not self._closing.wait(tick):
            now = time.monotonic()
            with self._dl_lock:
                late = [s for s, d in self._deadlines.items() if d <= now]
                for s in late:
                    del self._deadlines[s]
            for s in late:
                self.deadline_closed += 1
                self.log_once(
                    "deadline",
                    "connection closed: request not completed within its deadline",
                    deadline_s=self.request_deadline_s,
                    closed=self.deadline_closed,
                )
                try:
                    s.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns; its thread ends
                except OSError:
                    pass

    # -- accept at the descriptor limit ------------------------------------------------

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as exc:
            if accept_failed(self, exc):
                self._sleep(ACCEPT_PAUSE_S)
            raise

    # -- errors ----------------------------------------------------------------------

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) and client_address else ""
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
            client_gone(self, exc, peer)
            return
        self.handler_errors += 1
        first, suppressed = self._limit.should_log(f"handler:{type(exc).__name__}", time.monotonic())
        if first:
            self._log.error(
                "request handler failed", peer=peer, error=repr(exc)[:300], suppressed=suppressed, exc_info=exc
            )

    def log_once(self, key: str, event: str, **kw: Any) -> None:
        first, suppressed = self._limit.should_log(key, time.monotonic())
        if first:
            self._log.warning(event, suppressed=suppressed, **kw)

    def server_close(self) -> None:
        self._closing.set()
        super().server_close()


class GuardedServer6(GuardedServer):
    address_family = socket.AF_INET6


class GuardedHandler(BaseHTTPRequestHandler):
    """Arms the server's deadline for each request on the connection."""

    server: GuardedServer

    def handle_one_request(self) -> None:
        srv = self.server
        srv.arm(self.connection)
        try:
            srv.waiting(self.connection, True)  # evictable until the request's first byte is in
            try:
                first = self.rfile.peek(1)  # type: ignore[attr-defined]  # makefile("rb"): a BufferedReader
            except (TimeoutError, OSError):
                first = b""
            finally:
                srv.waiting(self.connection, False)
            if not first:  # closed, evicted, timed out or shut at the deadline before a request began
                self.close_connection = True
                return
            super().handle_one_request()
        finally:
            srv.disarm(self.connection)


def fit_fd_limit(max_connections: int, log: Any = None) -> int:
    """Raise this process's descriptor limit (soft, up to the hard one) to hold
    ``max_connections`` plus ``RESERVE_FDS``, and return the connection cap that
    fits: a cap past the descriptor limit would let idle sockets exhaust the
    descriptors (accept fails for everyone) before the cap could act."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = max_connections + RESERVE_FDS
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    except (OSError, ValueError):
        return max_connections
    if soft == resource.RLIM_INFINITY or soft >= max_connections + RESERVE_FDS:
        return max_connections
    fits = max(16, soft - RESERVE_FDS)
    if log is not None:
        log.warning(
            "connection cap lowered",
            max_connections=max_connections,
            now=fits,
            nofile=soft,
            detail="the descriptor limit cannot hold the cap; raise LimitNOFILE (ulimit -n)",
        )
    return fits


def server_class(host: str) -> type[GuardedServer]:
    return GuardedServer6 if ":" in host else GuardedServer


# How a connection fails, the same in the thread-per-connection servers here and the
# coordinator's event loop (coordinator/intake/httpio.py): each server keeps its own
# way of pausing and closing, these count and log.


class Guarded(Protocol):
    """What the helpers below need of a server: its counters and its once-a-minute warning."""

    max_connections: int
    refused_busy: int
    accept_errors: int
    client_errors: int

    def log_once(self, key: str, event: str, **kw: Any) -> None: ...


def accept_failed(server: Guarded, exc: OSError) -> bool:
    """An accept that raised. For lack of descriptors or memory (``OUT_OF_FDS``):
    counted (``accept_errors``), logged once a minute, and True: the caller pauses
    accepting for ``ACCEPT_PAUSE_S`` (the connections being served free theirs;
    the listening socket stays readable, so accepting at once would spin). Any
    other error: False, the caller's to handle."""
    if exc.errno not in OUT_OF_FDS:
        return False
    server.accept_errors += 1
    server.log_once(
        "accept",
        "accept failed: out of file descriptors or memory; pausing the accept loop",
        error=str(exc),
        failures=server.accept_errors,
    )
    return True


def client_gone(server: Guarded, exc: BaseException, peer: str) -> None:
    """A client that disconnected or reset mid-request: counted (``client_errors``)
    and logged once a minute, without a traceback (a flood of them would fill the log)."""
    server.client_errors += 1
    server.log_once(
        "client", "client disconnected mid-request", peer=peer, error=type(exc).__name__, total=server.client_errors
    )


def refuse_busy(server: Guarded, conn: Any, peer: str) -> None:
    """One connection past ``server.max_connections``: answered 503 without being
    read or served, counted (``server.refused_busy``) and logged once a minute
    (``server.log_once``). The caller closes it."""
    server.refused_busy += 1
    server.log_once(
        "busy",
        "connection refused: too many open connections",
        peer=peer,
        max_connections=server.max_connections,
        refused=server.refused_busy,
    )
    try:
        conn.setblocking(False)
        conn.send(_BUSY)
    except OSError:
        pass
