"""When the heartbeat reads the Flight Recorder: within the duty budget, and at once in a hang.

``FlightRecorderReads.poll`` is what the monitor hands the heartbeat (a no-op
instead when the Flight Recorder is off by configuration). A read costs the
process a dump of FR's ring, so it stays within flight_recorder.DUTY, except once
per wait in a collective that lasts STUCK_READ_NS and once per stall outside one
(STALL_READ_BEATS): a hang is when the ranks' Flight Recorders matter, and a
training thread that is blocked loses nothing to the read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from watchdog.contracts import slot as wire
from watchdog.hook.completion import flight_recorder

# A collective wait this long gets a Flight Recorder read at once.
STUCK_READ_NS = 1_000_000_000
# So does a rank that looks stalled outside any collective the hook sees (no step, no
# new Flight Recorder entry) for this many heartbeats, or two of its last steps if
# longer: it may be waiting in one issued from C++ (DDP's _pre_forward, FSDP), or be
# the rank the others wait for. Either way the coordinator needs a reading of its
# Flight Recorder made after the stall began, and the duty budget may be 35 s away.
STALL_READ_BEATS = 4


class FlightRecorderReads:
    """Decides, each heartbeat, whether ``source`` reads now (see the module docstring)."""

    def __init__(
        self,
        source: flight_recorder.FlightRecorderSource,
        recorder: Any,
        words: Any,
        clock: Callable[[], int],
        heartbeat_interval_s: float,
    ) -> None:
        self.source = source
        self._rec = recorder  # its collectives (in one, since when) and its steps
        self._words = words  # the slot's int64 words: H_LAST_STEP_NS
        self._clock = clock
        self._forced_for = -1  # the collective wait a read was already forced for
        # What "no progress" is compared against (steps, newest FR entry), since when, and whether the
        # one read such a stall gets was made: a read that finds new entries is progress, so a stall
        # gets one forced read, and a slow step at most one.
        self._still: tuple = ()
        self._still_since = 0
        self._still_forced = False
        self.still_ns = int(STALL_READ_BEATS * heartbeat_interval_s * 1e9)

    def poll(self) -> None:
        rec = self._rec
        m = rec.collectives
        since = m.span_start
        now = self._clock()
        if m.outstanding and since != self._forced_for and now - since > STUCK_READ_NS:
            self._forced_for = since
            self.source.poll(force=True)
        elif not m.outstanding and self._stalled_outside_collectives(now):
            self._still_forced = True
            self.source.poll(force=True)
        else:
            self.source.poll()
        still = (rec.steps, self.source.newest)  # after the read: what it found is not a stall
        if still != self._still:
            self._still, self._still_since, self._still_forced = still, now, False

    def _stalled_outside_collectives(self, now: int) -> bool:
        """No step and no new Flight Recorder entry for the stall threshold, and no
        read forced for this stall yet."""
        if self._still_forced or not self._still or self._rec.steps != self._still[0]:
            return False
        limit = max(self.still_ns, 2 * self._words[wire.H_LAST_STEP_NS])
        return now - self._still_since >= limit
