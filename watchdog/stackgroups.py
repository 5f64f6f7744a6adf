"""Every rank's Python stack, grouped: ranks with the same main-thread stack form
one group, so at 16,384 ranks the one rank in its data loader stands out from
the 16,383 waiting in the all-reduce. Pure: text in, groups out.

Used by the coordinator (the ``stack_groups`` journal record and its one-line
summary) and by ``watchdog timeline`` (text, HTML stack tree, folded export).

- Signature: the innermost ``MAX_FRAMES`` frames of the thread named MainThread
  in ``py-spy dump`` output (the training loop runs there; gloo, heartbeat and
  loader threads are noise), each as (function, normalised file, line). Files
  are cut after ``site-packages/`` (two hosts' virtualenvs must not split a
  group) and lines kept: two ranks at different lines are at different places.
- A failed dump is a group too ("no stack: process gone"), so a missing rank is
  counted, never silently dropped.
- Order: the culprit's group first, then the smallest groups (the odd ones out),
  then by lowest rank. Hostile input (a 64 KB stack, 16,384 distinct stacks) is
  capped: ``MAX_FRAMES`` per signature, ``MAX_GROUPS`` groups kept with the rest
  counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from watchdog.contracts.finding import ranks_phrase

MAX_FRAMES = 32  # innermost frames kept per signature: deeper ones are the same launcher frames everywhere
MAX_GROUPS = 256  # groups kept; the remainder is counted (16,384 distinct stacks must not make 16,384 groups)
MAX_FRAME_CHARS = 200
MAX_RANKS = 1 << 20  # a record claiming more ranks than any job has is hostile, not big
PHRASE_CHARS = 160  # rank ranges in one line of text: 8,000 scattered ranks must not make a 40 KB line
ODD_MAX_GROUPS = 8  # more small groups than this is not "an odd one out", it is chaos

_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([a-z]+)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^ {4}(\S.*?) \((.*):(\d+)\)\s*$")
_LIB = re.compile(r"^.*?/(?:site-packages|dist-packages)/")
_PYLIB = re.compile(r"^.*?/lib/python3(?:\.\d+)?/")
_DIGITS = re.compile(r"\d+")

Frame = tuple[str, str, int]  # (function, normalised file, line)


def normalise_file(path: str) -> str:
    """``/x/venv/lib/python3.11/site-packages/torch/_tensor.py`` -> ``torch/_tensor.py``;
    ``/usr/lib/python3.11/threading.py`` -> ``threading.py``; else unchanged."""
    for pat in (_LIB, _PYLIB):
        m = pat.match(path)
        if m:
            return path[m.end() :]
    return path


def main_frames(text: str, max_frames: int = MAX_FRAMES) -> list[Frame]:
    """Frames of the MainThread block, innermost first (py-spy's order); the first
    thread's when none is named MainThread; [] when no frame parses."""
    blocks: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            blocks.append((m.group(3) or "", []))
            continue
        f = _FRAME.match(line)
        if f and blocks and len(blocks[-1][1]) < max_frames:
            blocks[-1][1].append(
                (f.group(1)[:MAX_FRAME_CHARS], normalise_file(f.group(2))[:MAX_FRAME_CHARS], int(f.group(3)[:9]))
            )
    main = next((fr for name, fr in blocks if name == "MainThread"), None)
    if main is None:
        main = blocks[0][1] if blocks else []
    return main


def failure_key(error: str) -> str:
    """A failed dump's group: the reason's first clause with numbers masked, so
    "pid 4242 is gone" and "pid 4243 is gone" are one group."""
    head = (error or "no reason given").split(";")[0].split(" / ")[0].strip()
    return _DIGITS.sub("N", head)[:160]


@dataclass(frozen=True)
class Group:
    frames: tuple[Frame, ...]  # innermost first; () for a failed dump
    ranks: tuple[int, ...]  # sorted
    error: str = ""  # failure_key for a failed dump
    culprit: bool = False  # holds one of the finding's culprits

    @property
    def count(self) -> int:
        return len(self.ranks)

    def brief(self, max_frames: int = 4) -> str:
        """ "all_reduce <- backward <- … <- main (train.py:212)": the innermost frames by
        name, then the first frame outside torch and the standard library (the
        user's code) with its file:line; the innermost with file:line if none is."""
        if not self.frames:
            return f"no stack: {self.error}"
        user = next((i for i, f in enumerate(self.frames) if not _library(f[1])), None)
        if user is None:
            func, file, line = self.frames[0]
            return " <- ".join([f"{func} ({file}:{line})"] + [f[0] for f in self.frames[1:max_frames]])
        lib = [f[0] for f in self.frames[:user]]
        keep = max(0, max_frames - 1)
        out = lib[:keep] + (["…"] if len(lib) > keep else [])
        func, file, line = self.frames[user]
        return " <- ".join([*out, f"{func} ({file}:{line})"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "ranks": rank_ranges_list(self.ranks),
            "culprit": self.culprit,
            "frames": [list(f) for f in self.frames],
            "error": self.error,
            "brief": self.brief(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Group:
        """Raises ValueError on anything malformed (the caller skips the record)."""
        try:
            frames = tuple((str(f[0]), str(f[1]), int(f[2])) for f in (d.get("frames") or ())[:MAX_FRAMES])
            spans = [(int(a), int(b)) for a, b in d["ranks"]]
        except (TypeError, KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"malformed stack group: {exc}") from None
        if any(a < 0 or b < a for a, b in spans) or sum(b - a + 1 for a, b in spans) > MAX_RANKS:
            raise ValueError(f"malformed stack group: rank ranges out of bounds (at most {MAX_RANKS} ranks)")
        ranks = tuple(r for a, b in spans for r in range(a, b + 1))
        return cls(
            frames=frames[:MAX_FRAMES],
            ranks=ranks,
            error=str(d.get("error") or "")[:160],
            culprit=bool(d.get("culprit")),
        )


@dataclass(frozen=True)
class Grouping:
    groups: tuple[Group, ...]  # ordered: culprit's first, then smallest, then lowest rank
    ranks: int  # ranks with a stack or a failure in the set
    dropped_groups: int = 0  # beyond MAX_GROUPS
    dropped_ranks: int = 0

    def odd_ones_out(self) -> tuple[Group, ...]:
        """The small groups, when one group is clearly the rest: strictly the largest,
        and the others together at most half of the ranks, in at most ODD_MAX_GROUPS."""
        if len(self.groups) < 2 or self.dropped_groups:
            return ()
        big = max(self.groups, key=lambda g: g.count)
        others = [g for g in self.groups if g is not big]
        if any(g.count >= big.count for g in others) or len(others) > ODD_MAX_GROUPS:
            return ()
        if sum(g.count for g in others) * 2 > self.ranks:
            return ()
        return tuple(others)

    def majority(self) -> Group | None:
        return max(self.groups, key=lambda g: g.count) if self.odd_ones_out() else None

    def summary(self) -> str:
        """One line for the journal, a log, the root cause: the odd ones out against the rest."""
        if not self.groups:
            return "no stacks"
        odd, big = self.odd_ones_out(), self.majority()
        if odd and big is not None:
            parts = [f"{short_phrase(g.ranks)} in {g.brief(3)}" for g in odd]
            return (
                f"odd one{'s' if len(odd) > 1 else ''} out: "
                + "; ".join(parts)
                + f" (the other {big.count} in {big.brief(3)})"
            )
        return f"{len(self.groups)} stack group(s) over {self.ranks} ranks, no clear odd one out: " + "; ".join(
            f"{g.count} in {g.brief(2)}" for g in self.groups[:3]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "groups": [g.to_dict() for g in self.groups],
            "dropped_groups": self.dropped_groups,
            "dropped_ranks": self.dropped_ranks,
            "summary": self.summary(),
            "odd_ones_out": [rank_ranges_list(g.ranks) for g in self.odd_ones_out()],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grouping:
        groups = tuple(Group.from_dict(g) for g in (d.get("groups") or ())[:MAX_GROUPS])
        return cls(
            groups=groups,
            ranks=int(d.get("ranks") or sum(g.count for g in groups)),
            dropped_groups=int(d.get("dropped_groups") or 0),
            dropped_ranks=int(d.get("dropped_ranks") or 0),
        )


Key = tuple[tuple[Frame, ...], str]  # (frames, failure_key): what makes two ranks one group


def signature(ok: bool, text: str, error: str) -> Key:
    """A rank's group key: its main-thread frames, or why it has none."""
    frames = tuple(main_frames(text)) if ok else ()
    return frames, "" if frames else failure_key(error if not ok else "py-spy printed no frame")


def group(
    stacks: Iterable[tuple[int, bool, str, str]], culprits: Sequence[int] = (), max_groups: int = MAX_GROUPS
) -> Grouping:
    """``stacks``: (rank, ok, text, error) per rank. A rank seen twice keeps its
    first dump with frames (a later failure never hides a stack)."""
    by_rank: dict[int, Key] = {}
    for rank, ok, text, error in stacks:
        key = signature(ok, text, error)
        if rank in by_rank and (by_rank[rank][0] or not key[0]):
            continue
        by_rank[rank] = key
    members: dict[Key, list[int]] = {}
    for rank, key in by_rank.items():
        members.setdefault(key, []).append(rank)
    return from_members(members, culprits, max_groups)


def from_members(members: dict[Key, list[int]], culprits: Sequence[int] = (), max_groups: int = MAX_GROUPS) -> Grouping:
    culprit_set = set(culprits)
    groups = [
        Group(frames=k[0], ranks=tuple(sorted(v)), error=k[1], culprit=bool(culprit_set.intersection(v)))
        for k, v in members.items()
        if v
    ]
    groups.sort(key=lambda g: (not g.culprit, g.count, g.ranks[0]))
    kept, rest = groups[:max_groups], groups[max_groups:]
    return Grouping(
        groups=tuple(kept),
        ranks=sum(g.count for g in groups),
        dropped_groups=len(rest),
        dropped_ranks=sum(g.count for g in rest),
    )


def short_phrase(ranks: Sequence[int], max_chars: int = PHRASE_CHARS) -> str:
    """``ranks_phrase`` cut at a comma past ``max_chars``, with the count."""
    who = ranks_phrase(ranks)
    return who if len(who) <= max_chars else who[:max_chars].rsplit(",", 1)[0] + f",… ({len(ranks)} ranks)"


def rank_ranges_list(ranks: Iterable[int]) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]: 16,383 ranks in a few numbers."""
    out: list[list[int]] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def folded(grouping: Grouping) -> str:
    """The collapsed-stack format flame-graph tools read (Brendan Gregg's
    stackcollapse output; speedscope, inferno, flamegraph.pl): one line per group,
    root (outermost) frame first, frames joined by ';', then a space and the count.
    ';' inside a frame name would split it, so it becomes ':'."""
    lines = []
    for g in grouping.groups:
        names = [f"{func} ({file}:{line})" for func, file, line in reversed(g.frames)] or [f"no stack: {g.error}"]
        lines.append(";".join(n.replace(";", ":").replace("\n", " ") for n in names) + f" {g.count}")
    return "\n".join(lines) + ("\n" if lines else "")


def _library(file: str) -> bool:
    """Frames worth skipping in a one-line brief: torch and the standard library."""
    return file.startswith(
        (
            "torch/",
            "threading.py",
            "multiprocessing/",
            "concurrent/",
            "selectors.py",
            "queue.py",
            "<frozen",
            "socket.py",
            "subprocess.py",
            "contextlib.py",
            "json/",
            "importlib/",
        )
    )
