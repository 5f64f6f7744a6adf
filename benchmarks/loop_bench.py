"""The coordinator's HTTP server alone, on the stdlib's asyncio event loop and
on uvloop's: server CPU per request at a fixed request rate over many kept-alive
connections, as 2,048 agents reporting once a second make it.

    python benchmarks/loop_bench.py [--connections 2048] [--rate 2048] [--seconds 10] [--body 6000] [--rounds 3]

The server is ``httpio.LoopServer`` with handlers that do no work (a fixed
~200-byte reply), in a process of its own; the clients are another process
(asyncio on uvloop, so they keep up), each connection sending a POST of
``--body`` bytes, then waiting for the reply, paced so the whole sends
``--rate`` requests a second. Rounds alternate the two loops; each prints the
server process's CPU (user + system) per request and its share of a core. The
handlers' own work (the fold) is the same on either loop and is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from watchdog.coordinator.intake import httpio

REPLY = (
    b'{"ok":true,"commands":[],"interval_s":1.0,"report_versions":[1,2],"backpressure":null,"pad":"' + b"x" * 96 + b'"}'
)


def _server(loop_kind: str, port_q: mp.Queue, stop: mp.Event, out: mp.Queue) -> None:
    served = [0]

    def post(req: httpio.Request, body: bytes) -> httpio.Response:
        served[0] += 1
        return httpio.Response(200, REPLY)

    srv = httpio.LoopServer(
        ("127.0.0.1", 0),
        socket.AF_INET,
        check_post=lambda req: None,
        post=post,
        get=lambda req: httpio.Response(200, b"{}"),
        on_body_error=lambda req, n: httpio.Response(400, b"{}", close=True),
        body_timeout_s=lambda: 30.0,
        event_loop=loop_kind,
    )
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    port_q.put(srv.server_address[1])
    marks = []
    while not stop.is_set():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        marks.append((time.monotonic(), ru.ru_utime + ru.ru_stime, served[0]))
        stop.wait(1.0)
    srv.shutdown()
    srv.server_close()
    out.put(marks)


async def _client(port: int, conns: int, rate: float, seconds: float, body: bytes) -> int:
    head = (
        f"POST /v1/report HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    req = head + body
    end = time.monotonic() + seconds
    done = [0]

    async def one(i: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        period = conns / rate
        await asyncio.sleep(period * i / conns)  # spread, as the agents' start-up jitter does
        nxt = time.monotonic()
        while time.monotonic() < end:
            w.write(req)
            line = await r.readuntil(b"\r\n\r\n")
            n = int(line.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await r.readexactly(n)
            done[0] += 1
            nxt += period
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        w.close()

    await asyncio.gather(*(one(i) for i in range(conns)))
    return done[0]


def _clients(port: int, conns: int, rate: float, seconds: float, body_len: int, out: mp.Queue) -> None:
    import uvloop

    out.put(uvloop.run(_client(port, conns, rate, seconds, b"x" * body_len)))


def _round(kind: str, args: argparse.Namespace) -> tuple[float, float, int]:
    ctx = mp.get_context("spawn")
    port_q, out, got, stop = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    sp = ctx.Process(target=_server, args=(kind, port_q, stop, out))
    sp.start()
    port = port_q.get(timeout=30)
    procs = [
        ctx.Process(target=_clients, args=(port, n, args.rate * n / args.connections, args.seconds, args.body, got))
        for n in _split(args.connections, args.client_procs)
    ]
    for p in procs:
        p.start()
    sent = sum(got.get(timeout=args.seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    stop.set()
    marks = out.get(timeout=30)
    sp.join()
    # The steady part: from 20% into the run to its last mark with traffic.
    t0 = marks[0][0]
    steady = [m for m in marks if m[0] - t0 >= 0.2 * args.seconds and m[0] - t0 <= args.seconds]
    (a_t, a_cpu, a_n), (b_t, b_cpu, b_n) = steady[0], steady[-1]
    return (b_cpu - a_cpu) / max(1, b_n - a_n) * 1e6, (b_cpu - a_cpu) / (b_t - a_t), sent


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=2048)
    ap.add_argument("--rate", type=float, default=2048.0, help="requests a second, all connections together")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--body", type=int, default=6000, help="bytes per request body (a version-2 report: ~6 KB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--client-procs", type=int, default=2)
    args = ap.parse_args()
    print(
        f"{args.connections} connections, {args.rate:.0f} requests/s, {args.body} B bodies, {args.seconds:.0f} s a round"
    )
    print(f"{'loop':8} {'round':>5} {'server us/req':>14} {'core share':>11} {'requests':>9}")
    for i in range(args.rounds):
        for kind in ("asyncio", "uvloop"):
            us, share, sent = _round(kind, args)
            print(f"{kind:8} {i + 1:>5} {us:>14.1f} {share:>11.2f} {sent:>9}", flush=True)


if __name__ == "__main__":
    main()
