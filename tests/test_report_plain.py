"""A version-2 report's rows checked all at once (``Layout.plain``) give
exactly what the per-row path gives: the same HostReport (values and their
types: repr tells 1 from 1.0 and from True), the same rank dicts key for key,
the same drops with the same messages, the same refusals. ``plain`` answers
only for a report whose every row is plainly fine; anything else, hostile or
merely unusual, must come out of the per-row path unchanged."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import fields

import pytest

from watchdog import report
from watchdog.contracts.report import rows as layouts
from watchdog.contracts.report import table
from watchdog.coordinator import testing as t
from watchdog.report import HostReport, ReportError, as_rows

OPTIONAL = ("loss", "loss_finite", "loss_step", "coll_bytes_total", "batch_per_rank", "death", "recent_colls")
HOSTILE: list[object] = [
    0,
    1,
    -1,
    0.0,
    -0.0,
    1.5,
    -1e-9,
    1e9,
    1e9 - 1,
    1e11,
    2**62 - 1,
    2**62,
    2**63,
    -(2**63) - 1,
    10**400,
]
HOSTILE += [float("nan"), float("inf"), -float("inf"), 1e308, True, False, "1", "x" * 40, None, [], {}, [[]], -1.0]


def wire(obj):
    return json.loads(json.dumps(obj))


def outcome(body: dict, tolerant: bool, plain: bool, monkeypatch) -> tuple:
    """What from_dict makes of ``body``: through ``plain`` where it answers, or
    the per-row path alone."""
    with monkeypatch.context() as m:
        if not plain:
            m.setattr(layouts.Layout, "plain", lambda self, rows: None)
        dropped: list | None = [] if tolerant else None
        try:
            rep = HostReport.from_dict(copy.deepcopy(body), dropped)
        except (ReportError, OverflowError) as exc:  # OverflowError: 10**400 as a float, without ``dropped``
            return ("refused", type(exc), str(exc))
    return (
        repr(rep),
        [r.death for r in rep.ranks],  # not compared by ==
        [[type(getattr(r, f.name)) for f in fields(r)] for r in rep.ranks],
        [[type(getattr(r.coll, f.name)) for f in fields(r.coll)] for r in rep.ranks],
        dropped,
    )


def assert_same(body: dict, monkeypatch) -> None:
    for tolerant in (True, False):
        assert outcome(body, tolerant, True, monkeypatch) == outcome(body, tolerant, False, monkeypatch), body


def agent_body(rng: random.Random, n: int | None = None) -> dict:
    """A version-2 body as some agent sends it, every rank plainly fine."""
    world = rng.choice([8, 16, 64, 16384])
    n = rng.randint(1, 8) if n is None else n
    ranks = []
    for r in rng.sample(range(world), n):
        extra: dict = {"cpu_percent": rng.random() * 100}
        if rng.random() < 0.2:
            extra["recent_colls"] = tuple(t.sig(s, elements=rng.randint(1, 99)) for s in range(1, rng.randint(2, 4)))
        if rng.random() < 0.1:
            extra["recent_gpu"] = t.gpu_steps(5, rng.randint(1, 3), lag_s=rng.random())
            extra["gpu_clock"] = "gpu"
        if rng.random() < 0.3:
            extra.update(loss=rng.random() * 3, loss_step=rng.randint(1, 99), fr_read_age_s=rng.random())
        if rng.random() < 0.2:
            extra.update(loss=-rng.random(), fr_read_age_s=rng.choice([0.0, -0.0, -1.0]), cpu_percent=0.0)
        ranks.append(
            t.rank(
                r,
                world_size=world,
                step=rng.randint(0, 10**6),
                heartbeat_age_s=rng.random(),
                recent_steps=t.steps(rng.randint(1, 99), rng.choice([0, 0, 1, 4, 5, 9]), step_s=rng.random()),
                collective=t.coll(seq=rng.randint(0, 99), outstanding=rng.randint(0, 1), since_s=rng.random()),
                **extra,
            )
        )
    body = wire(t.report("h", ranks, seq=rng.randint(1, 10**6)).to_dict())
    older, short = rng.random() < 0.25, rng.random() < 0.25
    for d in body["ranks"]:
        if older:  # an agent from before these fields: every rank of it lacks them
            for k in OPTIONAL:
                d.pop(k, None)
        if short:  # nor the finer split of a step
            for x in d["recent_steps"]:
                for k in ("coll_bytes", *table.FINER):
                    x.pop(k)
    v2 = wire(as_rows(body))
    if rng.random() < 0.3:
        _shuffle_fields(rng, v2)
    if rng.random() < 0.1:  # a newer agent's field
        v2["rank_fields"].append("from_the_future")
        for row in v2["ranks"]:
            row.append({"x": 1})
    return v2


def _shuffle_fields(rng: random.Random, body: dict) -> None:
    """The same content under field lists in another order."""
    for name, rows in (
        ("rank_fields", body["ranks"]),
        ("coll_fields", [row[body["rank_fields"].index("coll")] for row in body["ranks"]]),
        (
            "step_fields",
            [x for row in body["ranks"] for x in row[body["rank_fields"].index("recent_steps")]],
        ),
    ):
        order = list(range(len(body[name])))
        rng.shuffle(order)
        body[name] = [body[name][i] for i in order]
        for row in rows:
            row[:] = [row[i] for i in order]


def _mutate(rng: random.Random, body: dict) -> None:
    """One hostile or merely unusual change to a row."""
    rows = body["ranks"]
    at = {n: i for i, n in enumerate(body["rank_fields"])}
    row = rng.choice(rows)
    if type(row) is not list or len(row) != len(at):  # an earlier change's
        return
    kind = rng.random()
    coll, steps = row[at["coll"]], row[at["recent_steps"]]
    if kind < 0.5:
        row[rng.randrange(len(row))] = rng.choice(HOSTILE)
    elif kind < 0.65 and type(coll) is list and coll:
        coll[rng.randrange(len(coll))] = rng.choice(HOSTILE)
    elif kind < 0.8 and type(steps) is list and steps and type(steps[0]) is list and steps[0]:
        x = rng.choice(steps)
        if type(x) is list and x:
            x[rng.randrange(len(x))] = rng.choice(HOSTILE)
    else:
        rng.choice(
            [
                lambda: rows.append(copy.deepcopy(row)),  # a rank twice
                lambda: row.pop(),
                lambda: row.append(0),
                lambda: rows.append({"rank": 1}),
                lambda: (
                    row.__setitem__(at["coll"], dict(zip(body["coll_fields"], coll))) if type(coll) is list else None
                ),
                lambda: row.__setitem__(at["recent_steps"], [[]] * 300),
                lambda: row.__setitem__(at["recent_steps"], [["x"]]),
                lambda: row.__setitem__(at["rank"], row[at["world_size"]]),
                lambda: row.__setitem__(at["world_size"], 1 + (1 << 20)),
                lambda: row.__setitem__(at["gpu_clock"], "g" * 33) if "gpu_clock" in at else None,
                lambda: row.__setitem__(at["death"], {"summary": "x"}) if "death" in at else None,
                lambda: row.__setitem__(at["death"], []) if "death" in at else None,
                lambda: row.__setitem__(at["recent_colls"], [{"seq": 0}]) if "recent_colls" in at else None,
                lambda: row.__setitem__(at["recent_gpu"], None) if "recent_gpu" in at else None,
                lambda: row.__setitem__(at["recent_gpu"], [{"step": -1}]) if "recent_gpu" in at else None,
            ]
        )()


def test_agent_reports_take_the_whole_report_path(monkeypatch):
    rng = random.Random(5)
    taken = 0
    for _ in range(300):
        body = agent_body(rng)
        lay = layouts.layout(body)
        got = lay.plain(body["ranks"])
        expected = [lay.checked_rank(row, i) for i, row in enumerate(body["ranks"])]
        if got is None:  # only for a rank the per-row path could not call in range at once either
            assert not all(fine for _, fine in expected)
            continue
        taken += 1
        assert got == tuple(r for r, _ in expected)
        assert all(report.rank_problem(r) == "" for r in got)  # GPU-side steps too, checked by their parser
        assert_same(body, monkeypatch)
    assert taken > 250


@pytest.mark.parametrize("seed", range(4))
def test_hostile_rows_come_out_as_the_per_row_path_has_them(seed, monkeypatch):
    rng = random.Random(seed)
    for _ in range(150):
        body = agent_body(rng)
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate(rng, body)
        assert_same(body, monkeypatch)


def hostile_rows(values: list) -> Iterator[dict]:
    """A two-rank agent's body with every position of the second rank's row, its
    coll row and a step row, in turn, set to each of ``values``, the other rank
    left alone."""
    rng = random.Random(3)
    base = agent_body(rng, n=2)
    while not base["ranks"][1][base["rank_fields"].index("recent_steps")]:
        base = agent_body(rng, n=2)
    at = {n: i for i, n in enumerate(base["rank_fields"])}
    for value in values:
        for j in range(len(base["rank_fields"])):
            body = copy.deepcopy(base)
            body["ranks"][1][j] = value
            yield body
        for where in ("coll", "recent_steps"):
            width = len(base["coll_fields"] if where == "coll" else base["step_fields"])
            for j in range(width):
                body = copy.deepcopy(base)
                sub = body["ranks"][1][at[where]]
                (sub if where == "coll" else sub[0])[j] = value
                yield body


def test_every_value_of_a_row_set_to_each_hostile_value(monkeypatch):
    cases = 0
    for body in hostile_rows(HOSTILE):
        assert_same(body, monkeypatch)
        cases += 1
    assert cases > 1000


def test_values_at_the_edges_of_their_ranges(monkeypatch):
    """Exactly at and just past each limit the whole-report checks hold: the
    same answer as a row's, whichever side of the limit."""
    rng = random.Random(11)
    edges: dict[str, list[object]] = {
        "world_size": [1, 1 << 20, (1 << 20) + 1],
        "rank": [0, -1],
        "pid": [1, 0],
        "step": [0, 2**62 - 1, 2**62],
        "heartbeat_age_s": [0.0, -0.0, 1e9 - 64, 1e9, 5e8],
        "cpu_percent": [0.0, 1e7 - 1, 1e7, -0.0],
        "created_wall": [0.0, 1e11 - 1e-3, 1e11],
        "fr_read_age_s": [-1.0, -0.5, -2.0, 0.0, 1e9, 1e9 - 64],
        "fr_newest_group": [-(2**63), 2**63 - 1, 2**63, -(2**63) - 1],
        "loss": [-1e308, 1e308],
        "gpu_clock": ["g" * 32, "g" * 33],
    }
    for name, values in edges.items():
        for value in values:
            for row in (0, None):
                body = agent_body(rng, n=3)
                if body["rank_fields"] != list(report.RANK_FIELDS):
                    continue
                at = body["rank_fields"].index(name)
                for i, r in enumerate(body["ranks"]):
                    if row is None or i == row:
                        r[at] = value
                assert_same(body, monkeypatch)


def test_many_ranks_and_long_step_lists(monkeypatch):
    rng = random.Random(2)
    body = agent_body(rng, n=8)
    at = body["rank_fields"].index("recent_steps")
    step_width = len(body["step_fields"])
    big = copy.deepcopy(body)
    big["ranks"] = []
    for i in range(600):
        row = copy.deepcopy(body["ranks"][i % 8])
        row[body["rank_fields"].index("rank")] = i
        row[body["rank_fields"].index("world_size")] = 1024
        big["ranks"].append(row)
    assert layouts.layout(big).plain(big["ranks"]) is not None
    assert_same(big, monkeypatch)
    for n in (report.MAX_STEPS_PER_RANK, report.MAX_STEPS_PER_RANK + 1):
        long = copy.deepcopy(body)
        step: list[object] = [0] * step_width
        for k, name in enumerate(long["step_fields"]):
            step[k] = {"step": 1, "phase": "train", "coll_bytes": 0}.get(name, 0.5)
        long["ranks"][0][at] = [list(step) for _ in range(n)]
        assert_same(long, monkeypatch)


def test_values_that_repeat_from_sample_to_sample_are_kept_once():
    """The coordinator keeps ~256 samples a rank: an agent's unmeasured finer split
    (four zeros a sample) and its phase are one object each, not one per sample
    (~150 of ~340 bytes a sample)."""
    steps = t.steps(first=10, n=4, phase="train")
    rep = HostReport.from_dict(
        json.loads(json.dumps(as_rows(t.report("h", [t.rank(3, recent_steps=steps)]).to_dict())))
    )
    got = rep.ranks[0].recent_steps
    assert got == steps
    assert len({id(x.phase) for x in got}) == 1
    assert len({id(getattr(x, f)) for x in got for f in ("forward_s", "backward_s", "optimizer_s", "h2d_s")}) == 1
