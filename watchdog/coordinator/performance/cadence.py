"""When the bottleneck verdict runs. Pure.

The verdict is never a finding, and at 16,384 ranks it cost ~85-125 ms of
every tick's thread CPU (health of every rank, 1,024 summaries refreshed, the
columns of 16,384 summaries). So it runs on a cadence that grows with the job:
every tick up to ``ranks_per_tick`` ranks (4,096 by default: small jobs see no
change), every ``ceil(ranks / ranks_per_tick)`` ticks above (at 16,384 ranks
every 4th), and never on a tick on which a finding opened (it pays for the
evidence requests and the hang analysis): the next tick runs it instead.
The straggler detector's rescoring, spread over ticks at scale, takes no step
on the verdict's turn (``upcoming``): at 16,384 ranks a verdict (60-90 ms) and
a rescoring on one tick were the tick's p99.
Its cost per run does not grow with the ticks skipped: its summaries refresh
within a fixed budget per run (``verdict.Summaries``).

Goodput is not on the cadence, measured: its ledger's work is per step sample
(ranks x steps, ~2 us each at 16,384 ranks), so running it every 4th tick made
that tick pay for 4 ticks' samples (537 ms instead of ~150 ms) and saved nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


def period(ranks: int, ranks_per_tick: int) -> int:
    """Ticks between two runs of the verdict: 1 up to ``ranks_per_tick`` ranks."""
    return max(1, -(-ranks // max(1, ranks_per_tick)))


@dataclass
class Cadence:
    ranks_per_tick: int = 4096
    _slot: int = 0  # ticks on which the verdict was given its turn (a finding's tick does not count)

    def upcoming(self, ranks: int) -> bool:
        """Whether this tick is the verdict's turn unless a finding opens on it, in a
        job large enough for the cadence (other heavy parts keep off it)."""
        k = period(ranks, self.ranks_per_tick)
        return k > 1 and (self._slot + 1) % k == 1

    def due(self, ranks: int, busy: bool) -> bool:
        """Whether the verdict runs on this tick. ``busy``: a finding opened on it."""
        k = period(ranks, self.ranks_per_tick)
        if k == 1:
            self._slot = 0
            return True
        if busy:
            return False
        turn = self.upcoming(ranks)
        self._slot += 1
        return turn
