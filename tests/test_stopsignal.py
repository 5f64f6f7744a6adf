"""SIGTERM stops a daemon even when it lands while the main thread holds the stop
event's lock (inside ``Event.wait``, where the agent and coordinator spend their
time): setting the event from the handler itself would deadlock there."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import os, signal, threading, time
from watchdog.stopsignal import stop_on_signals

stop = threading.Event()
said = []
stop_on_signals(stop, said.append)
with stop._cond:  # noqa: SLF001 - the lock Event.wait holds while it sleeps
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs here, in this thread, with the lock held
    assert not stop.is_set()
assert stop.wait(10), "the stop event was never set"
os.kill(os.getpid(), signal.SIGINT)
deadline = time.monotonic() + 10
while len(said) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
print(" ".join(said))
"""


def test_a_signal_landing_while_the_stop_lock_is_held_still_stops_the_daemon():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["SIGTERM", "SIGINT"]
