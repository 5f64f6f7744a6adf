"""Agent overhead: CPU (% of one core) and RSS of ``watchdog agent`` watching N fake
ranks that step at 10 Hz, polling at 10 Hz, scraped every 5 s, and (second row)
also reporting to a stub coordinator once a second. Budget: < 1 % CPU, < 80 MB.

    python benchmarks/agent_overhead.py [--ranks 8] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


class _Coordinator(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"ok": true, "commands": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def measure(run: Path, work: Path, seconds: float, coordinator_url: str) -> dict:
    addr_file = work / "addr"
    addr_file.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "watchdog.cli",
        "agent",
        "--run-dir",
        str(run),
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.address-file",
        str(addr_file),
        "--log.level",
        "warning",
    ]
    if coordinator_url:
        argv += ["--coordinator.url", coordinator_url]
    agent = subprocess.Popen(argv, env=ENV, stderr=subprocess.DEVNULL)
    try:
        while not (addr_file.exists() and addr_file.read_text().strip()):
            time.sleep(0.05)
        url = f"http://{addr_file.read_text().strip()}/metrics"
        proc = psutil.Process(agent.pid)
        time.sleep(3.0)  # warm-up: imports, first NVML attempt, first reads of every slot
        scrape = lambda: urllib.request.urlopen(url, timeout=5).read()  # noqa: E731
        scrape()
        c0, t0 = proc.cpu_times(), time.monotonic()
        rss_max, next_scrape = 0, t0 + 5.0
        while (now := time.monotonic()) < t0 + seconds:
            rss_max = max(rss_max, proc.memory_info().rss)
            if now >= next_scrape:
                scrape()
                next_scrape += 5.0
            time.sleep(0.5)
        c1, t1 = proc.cpu_times(), time.monotonic()
        body = scrape().decode()
        polls = next(float(ln.split()[-1]) for ln in body.splitlines() if ln.startswith("watchdog_agent_polls_total"))
        ranks = sum(1 for ln in body.splitlines() if ln.startswith("watchdog_rank_alive{") and ln.endswith(" 1.0"))
        cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100
        return {
            "cpu_pct": cpu,
            "rss_mb": rss_max / 2**20,
            "uss_mb": proc.memory_full_info().uss / 2**20,
            "polls": polls,
            "ranks": ranks,
        }
    finally:
        agent.terminate()
        agent.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run, work = Path(tmp) / "run", Path(tmp)
        run.mkdir()
        writer = [sys.executable, "-m", "watchdog.agent.testing", "--run-dir", str(run), "--job", "bench"]
        writers = [
            subprocess.Popen([*writer, "--rank", str(r), "--world-size", str(args.ranks)], env=ENV)
            for r in range(args.ranks)
        ]
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Coordinator)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            rows = [
                ("poll 10 Hz, scrape 5 s", measure(run, work, args.seconds, "")),
                ("+ report 1 Hz", measure(run, work, args.seconds, f"http://127.0.0.1:{srv.server_address[1]}")),
            ]
        finally:
            for w in writers:
                w.terminate()
                w.wait()
            srv.shutdown()
    print(
        f"\nagent overhead: {args.ranks} ranks stepping at 10 Hz, {args.seconds:.0f} s each, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(f"{'mode':<24} {'ranks':>5} {'polls/s':>8} {'CPU % core':>10} {'RSS MB':>7} {'USS MB':>7}")
    for name, r in rows:
        print(
            f"{name:<24} {r['ranks']:>5} {r['polls'] / (args.seconds + 3):>8.1f} {r['cpu_pct']:>10.2f} "
            f"{r['rss_mb']:>7.1f} {r['uss_mb']:>7.1f}"
        )
    print("budget: < 1 % of a core, < 80 MB RSS")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
