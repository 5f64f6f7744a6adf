"""A lost host's last state is stale: its ranks are not waiting in a collective "now".

Found on a real run (tests/test_e2e_host_cut.py): host B cut off while its ranks
were, as last reported, inside an all-reduce. Their wait grew with B's silence, so
the hang detector saw "ranks 2-3 waiting for 6 s" and blamed a live rank on host A
that happened to be between collectives: a healthy rank accused on stale data.
"""

from __future__ import annotations

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator


def test_a_lost_hosts_stale_collective_wait_blames_no_live_rank(tmp_path):
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=4), Journal(path, lambda: (1.7e9, 0.0)))
    history = t.steps(1, 40)
    opened = []
    for i in range(0, 41):
        now = 10.0 + i * 0.5
        step = 40 + i * 5
        if now <= 10.0:  # host B's last report: both ranks inside all-reduce #200
            c.accept(
                t.report(
                    "b",
                    [
                        t.rank(
                            r,
                            world_size=4,
                            step=40,
                            recent_steps=history,
                            collective=t.coll(seq=200, outstanding=1, since_s=0.01),
                        )
                        for r in (2, 3)
                    ],
                    seq=1,
                    interval_s=0.5,
                ),
                now,
            )
        # Host A keeps going: rank 0 caught inside a collective, rank 1 just between two.
        c.accept(
            t.report(
                "a",
                [
                    t.rank(
                        0,
                        world_size=4,
                        step=step,
                        recent_steps=history,
                        collective=t.coll(seq=900 + i, outstanding=1, since_s=0.01),
                    ),
                    t.rank(
                        1,
                        world_size=4,
                        step=step,
                        step_age_s=0.09,
                        recent_steps=history,
                        collective=t.coll(seq=900 + i),
                    ),
                ],
                seq=i + 1,
                interval_s=0.5,
            ),
            now,
        )
        opened += [f.key for f in c.tick(now + 0.01, 1.7e9 + now).opened]
    # A completes collectives past the one B's ranks were last seen in: they are alive, the
    # monitor is blind to B (analysis/silence.py); nobody on A blamed, nobody on B taken for dead.
    assert opened == [("host_unobserved", ())], opened
    hosts = {
        s: c.registry.get_sample_value("watchdog_coordinator_hosts", {"state": s})
        for s in ("reporting", "unobserved", "lost")
    }
    assert hosts == {"reporting": 1.0, "unobserved": 1.0, "lost": 0.0}
    c.journal.close()
