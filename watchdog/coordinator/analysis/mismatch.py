"""Mismatched collectives: ranks at the same (group, seq) that issued different ones.

Every rank must issue the same sequence of collectives on a group, with the same
op, element count and dtype. When one does not (a rank that all-reduces a tensor
of another size, skips a collective, or reduces in another dtype), NCCL hangs
or corrupts silently and gloo fails within milliseconds on whichever rank reads
the odd message first: often a healthy rank, which is then the first to die.
So the culprit is named from the recorded shapes, not from the order of deaths:
the rank(s) in the minority at the earliest mismatched (group, seq).

Two sources of shapes, never mixed (their sequence numbers count different things):
- ``fr``: the Flight Recorder's signatures (``FoldedRank.colls``): op, elements,
  dtype, shape, for every c10d collective, those issued from C++ included;
- ``hook``: the collective each rank last entered through the patched Python API
  (``RankState.coll``: op and bytes), which is in the slot before the collective
  runs, so it survives a crash that the Flight Recorder's reader did not see.

Pure: a function of the view. Culprits are named only when more than half of
the group issued the usual collective; with every rank in and no such majority
(two ranks, one each) the mismatch is reported with no culprit: both shapes,
no accusation.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import compress

from ..view import columns
from ..view.cluster import SIZE_FREE_OPS as _SIZE_FREE
from ..view.cluster import ClusterView

# Signatures of one (group, seq) further apart than this are not one collective
# (a restarted rank's numbering starting over next to an old incarnation's).
SAME_COLLECTIVE_S = 300.0


@dataclass(frozen=True)
class Mismatch:
    group: int
    seq: int
    source: str  # "fr" or "hook"
    odd: tuple[int, ...]  # the minority: the culprits; () when there is no majority
    usual: tuple[int, ...]  # ranks with the majority's signature (all the ranks at this key when odd is ())
    shapes: dict[int, str]  # rank -> what it issued, for a person
    onset: float  # coordinator time of the earliest signature at this key

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.shapes))


Entry = tuple[tuple, str, float]  # (comparable signature, description, coordinator time)


def _fr(view: ClusterView) -> dict[tuple[int, int], dict[int, Entry]]:
    """Only the keys where some rank differs are built in full: one dict probe per
    signature otherwise (4,096 ranks x 32 signatures is 131,072 of them a tick).
    Only the ranks with Flight Recorder entries are read (``fr_held``: every rank
    with ``colls``, hence with ``coll_keys``), found in the columns: without the
    Flight Recorder a pass over 16,384 rank objects found nothing, ~4 ms a tick."""
    first: dict[tuple[int, int], tuple] = {}
    differ: set[tuple[int, int]] = set()
    c = columns.of(view)
    ranks = view.ranks
    held = [(r, ranks[r]) for r in compress(c.rank, c.fr_held)]  # in the view's rank order, as before
    for _, rv in held:
        for key, sig, _ in rv.coll_keys:
            f = first.setdefault(key, sig)
            if f is not sig and f != sig:
                differ.add(key)
    out: dict[tuple[int, int], dict[int, Entry]] = {}
    if not differ:
        return out
    for r, rv in held:
        for (key, sig, at), (coll, _) in zip(rv.coll_keys, rv.colls):
            if key in differ:
                out.setdefault(key, {})[r] = (sig, coll.describe(), at)
    return out


def _hook(view: ClusterView) -> tuple[dict[tuple[int, int], dict[int, Entry]], dict[int, int]]:
    """(the keys where some rank differs, built in full; the ranks seen on each
    group). Read from the view's columns: the distinct (group, seq, op, bytes)
    are counted in C, and a job whose ranks agree has a handful of them (the
    collective most ranks are in, the next one), so the signatures are compared
    per distinct mark, not per rank; no description is built for 16,384 ranks a
    tick to find that they agree."""
    c = columns.of(view)
    first: dict[tuple[int, int], tuple] = {}
    differ: set[tuple[int, int]] = set()
    members: Counter[int] = Counter()
    # (first seen in the view's rank order, as the loop over the ranks it replaced)
    for (group, seq, op, nbytes), n in Counter(zip(c.coll_group, c.coll_seq, c.coll_op, c.coll_bytes)).items():
        if seq <= 0:
            continue
        key = (group, seq)
        sig = (op,) if op in _SIZE_FREE else (op, nbytes)
        if first.setdefault(key, sig) != sig:
            differ.add(key)
        members[group] += n
    out: dict[tuple[int, int], dict[int, Entry]] = {}
    if differ:
        for r, group, seq, op, nbytes, enter in zip(
            c.rank, c.coll_group, c.coll_seq, c.coll_op, c.coll_bytes, c.coll_enter
        ):
            if seq > 0 and (group, seq) in differ:
                sig = (op,) if op in _SIZE_FREE else (op, nbytes)
                out.setdefault((group, seq), {})[r] = (sig, f"{op} of {nbytes} bytes", enter)
    return out, dict(members)


def _judge(key: tuple[int, int], at_key: dict[int, Entry], source: str, group_size: int) -> Mismatch | None:
    """Culprits only when the usual signature is held by more than half of the
    group: signatures arrive rank by rank, and a minority seen early (the odd rank
    and one healthy one: a tie; two odd ranks and a healthy one: the wrong
    majority) must never accuse. Short of that, the key waits for the other ranks;
    once all are in with no majority, the mismatch is reported with no culprit."""
    if len(at_key) < 2:
        return None
    sigs = Counter(e[0] for e in at_key.values())
    if len(sigs) < 2:
        return None
    times = [e[2] for e in at_key.values()]
    if max(times) - min(times) > SAME_COLLECTIVE_S:
        return None
    (top, n_top), (_, n_next) = sigs.most_common(2)
    if n_top > n_next and 2 * n_top > group_size:
        odd = tuple(sorted(r for r, e in at_key.items() if e[0] != top))
        usual = tuple(sorted(r for r, e in at_key.items() if e[0] == top))
    elif len(at_key) >= group_size:
        odd, usual = (), tuple(sorted(at_key))
    else:
        return None  # wait for the others' signatures
    return Mismatch(
        group=key[0],
        seq=key[1],
        source=source,
        odd=odd,
        usual=usual,
        shapes={r: e[1] for r, e in sorted(at_key.items())},
        onset=min(times),
    )


def _group_sizes(view: ClusterView, keys: Iterable[tuple[tuple[int, int], Iterable[int]]]) -> dict[int, int]:
    """The default group is the world; another group's size is not reported, so
    it is taken as the ranks seen using it (a lower bound)."""
    members: dict[int, set[int]] = {}
    for key, at_key in keys:
        members.setdefault(key[0], set()).update(at_key)
    return {g: (max(view.world_size, len(m)) if g == 0 else len(m)) for g, m in members.items()}


# The last view judged and its answer: the view is immutable and several detectors
# (health.analyze, dead_rank, collective_mismatch) ask about the same one each tick.
# The view weakly held, as memo.per_tick does (freeing it is not the next tick's work).
_last: tuple[Callable[[], ClusterView | None], Mismatch | None] = (lambda: None, None)


def find(view: ClusterView) -> Mismatch | None:
    """``judge(view)``, remembered for the last view asked about."""
    global _last
    seen, answer = _last
    if seen() is view:
        return answer
    answer = judge(view)
    _last = (weakref.ref(view), answer)
    return answer


def judge(view: ClusterView) -> Mismatch | None:
    """The earliest mismatch that names a culprit, else the earliest that cannot;
    on a tie the Flight Recorder's (richer shapes). None when the ranks agree.

    Why a culprit beats an earlier tie: a rank that aborts within milliseconds of
    the odd collective (gloo's I/O thread, no Python exception) leaves no Flight
    Recorder read behind, so FR may hold the odd rank and one healthy one (a tie)
    while the hook's marks, written before the call, hold all three."""
    found = []
    fr = list(_fr(view).items())
    sizes = _group_sizes(view, fr)
    found += [m for key, at_key in fr if (m := _judge(key, at_key, "fr", sizes[key[0]])) is not None]
    # The hook's group sizes count every rank on the group (each has one key there), not only
    # the ranks at keys that differ: _hook returns them with the keys worth judging.
    hook, members = _hook(view)
    sizes = {g: (max(view.world_size, n) if g == 0 else n) for g, n in members.items()}
    found += [m for key, at_key in hook.items() if (m := _judge(key, at_key, "hook", sizes[key[0]])) is not None]
    if not found:
        return None
    return min(found, key=lambda m: (not m.odd, m.onset, m.source != "fr", m.seq, m.group))
