"""A command's trigger as the per-host journal lines carry it: at most 64 ranks,
still telling findings apart, grouped with the full trigger, read back by people."""

from __future__ import annotations

import json

from watchdog.coordinator.evidence import triggers


def test_a_trigger_of_few_ranks_is_carried_as_it_is():
    t = {"kind": "collective_hang", "ranks": list(range(64)), "action": "a-1"}
    assert triggers.brief(t) is t
    assert triggers.named({"kind": "frozen_rank", "ranks": [2]}) == "rank 2"


def test_many_ranks_are_cut_to_64_with_their_count_and_a_digest_of_all():
    full = {"kind": "frozen_rank", "ranks": list(range(16384)), "action": "a-3"}
    b = triggers.brief(full)
    assert b["ranks"] == list(range(64)) and b["ranks_total"] == 16384 and b["action"] == "a-3"
    assert len(json.dumps(b)) < 600  # the full list is ~90 KB
    assert triggers.brief(b) is b and triggers.key(b) == triggers.key(full)  # answers group with the request
    assert triggers.key(json.loads(json.dumps(b))) == triggers.key(full)  # and as read back from the journal
    assert triggers.named(b) == "ranks 0-63 and 16,320 more"
    assert full["ranks"] == list(range(16384)) and "ranks_total" not in full  # the caller's trigger is not changed


def test_two_findings_alike_in_their_first_64_ranks_stay_apart():
    a = {"kind": "frozen_rank", "ranks": list(range(100))}
    b = {"kind": "frozen_rank", "ranks": [*range(99), 200]}
    c = {"kind": "frozen_rank", "ranks": list(range(101))}
    assert len({triggers.key(a), triggers.key(b), triggers.key(c)}) == 3


def test_hostile_journal_values_read_without_error():
    for t in (
        {},
        {"ranks": "all"},
        {"kind": 3, "ranks": [None, True, "x", 5], "ranks_total": True},
        {"ranks": [1.5] * 70},
    ):
        triggers.key(t)
        assert isinstance(triggers.named(t), str)
    assert triggers.named({"ranks": [None, True, "x", 5], "ranks_total": True}) == "rank 5"
