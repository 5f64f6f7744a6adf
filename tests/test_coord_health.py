"""The coordinator's /healthz fails while its tick loop is wedged (the daemon
answers HTTP but detects nothing), and /readyz only after the journal replay and
the first tick. A real daemon on loopback; the tick wedged by a detector-like
fault injected into its coordinator."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

from waiting import wait_for

from watchdog.coordinator.config import Config
from watchdog.coordinator.daemon import Daemon, stale_after


def get(d: Daemon, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{d.address}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_fails_while_the_tick_is_wedged_and_recovers(tmp_path):
    cfg = Config(listen=("127.0.0.1", 0), job="job", world_size=2, journal=str(tmp_path / "j.jsonl"), tick_s=0.05)
    d = Daemon(cfg, stale_after_s=0.5)
    assert d.unready()  # not started: nothing replayed, no tick
    release = threading.Event()
    real_tick = d.coordinator.tick
    wedged = threading.Event()

    def tick(now, wall):
        if wedged.is_set():
            release.wait(30)
        return real_tick(now, wall)

    d.coordinator.tick = tick  # type: ignore[method-assign]
    d.start()
    try:
        wait_for(lambda: get(d, "/readyz")[0] == 200, 10, what="/readyz 200 after the first tick")
        assert get(d, "/healthz") == (200, "ok\n")
        wedged.set()
        _, body = wait_for(
            lambda: r if (r := get(d, "/healthz"))[0] == 503 else None, 10, what="/healthz 503 on a wedged tick"
        )
        assert "no tick finished" in body
        assert get(d, "/readyz")[0] == 200  # ready stays: it is liveness that failed
        wedged.clear()
        release.set()
        wait_for(lambda: get(d, "/healthz")[0] == 200, 10, what="/healthz back once ticks run")
    finally:
        release.set()
        d.stop()


def test_stale_limit_leaves_room_for_slow_ticks():
    assert stale_after(1.0) == 30.0  # production: a busy tick is no reason to restart it
    assert stale_after(5.0) == 50.0
