"""The ranks' Flight Recorder dumps in a journal: a summary for the text report,
and the per-rank files PyTorch's own analyzer reads.

PyTorch's analyzer (``python -m torch.distributed.flight_recorder.fr_trace DIR
-p rank_``) reads a directory of per-rank pickles named ``<prefix><rank>``, each
the dict ``_dump_fr_trace`` returns (``version``, ``pg_config``, ``pg_status``,
``entries``). ``watchdog timeline JOURNAL --fr-dump DIR`` writes one such
directory per fault the journal holds dumps for, so our verdict and PyTorch's can
be compared on the same hang.

One repair, seen on gloo with torch 2.13: ``pg_config`` names the default group
"" while its entries say "0"; the analyzer then fails on its own files
(KeyError ('0', 0)). When the entries use exactly one group name that
``pg_config`` lacks and ``pg_config`` holds only "", the group is renamed.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from watchdog.contracts.evidence import FlightRecorderDump
from watchdog.contracts.journal import Record
from watchdog.contracts.journal.commands import EvidenceRecord
from watchdog.coordinator.evidence import triggers

PREFIX = "rank_"


@dataclass
class FrSet:
    """Every rank's dump for one trigger (a finding), merged across hosts."""

    trigger: dict[str, Any]
    t_wall: float
    by_rank: dict[int, FlightRecorderDump] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.trigger.get('kind', '?')} naming {triggers.named(self.trigger) or 'no rank'}"


def collect(records: Iterable[Record]) -> list[FrSet]:
    sets: dict[str, FrSet] = {}
    for rec in records:
        if not isinstance(rec, EvidenceRecord) or not rec.flight_recorder:
            continue
        trigger: dict[str, Any] = rec.trigger or {}
        key = triggers.key(trigger)
        fs = sets.setdefault(key, FrSet(trigger=trigger, t_wall=rec.t_wall or 0.0))
        for d in rec.flight_recorder:
            try:
                dump = FlightRecorderDump.from_dict(d)
            except (TypeError, ValueError):
                continue
            fs.by_rank[dump.rank] = dump
    return sorted(sets.values(), key=lambda s: s.t_wall)


def _last(dump: FlightRecorderDump) -> str:
    if not dump.ok:
        return f"no dump ({dump.error})"
    if not dump.entries:
        return "no collective recorded"
    e = dump.entries[-1]
    sizes = e.get("input_sizes")
    dtypes = ",".join(map(str, e.get("input_dtypes") or [])) or "?"
    return (
        f"last #{e.get('collective_seq_id')} {e.get('profiling_name')} {sizes} {dtypes} "
        f"{e.get('state', '?')} ({len(dump.entries)} entries)"
    )


def lines(sets: list[FrSet]) -> list[str]:
    """The text report's section: per fault, each rank's last recorded collective;
    ranks whose last sequence number differs from most are marked."""
    out: list[str] = []
    for fs in sets:
        out.append(f"FLIGHT RECORDER ({fs.label}): {len(fs.by_rank)} ranks")
        seqs = {r: d.entries[-1].get("collective_seq_id") for r, d in fs.by_rank.items() if d.ok and d.entries}
        common = max(set(seqs.values()), key=list(seqs.values()).count) if seqs else None
        for r, d in sorted(fs.by_rank.items()):
            odd = " <- differs" if r in seqs and seqs[r] != common else ""
            out.append(f"  rank {r} (host {d.host}): {_last(d)}{odd}")
    return out


def fix_pg_config(pg_config: dict[str, dict[str, str]], entries: list[dict]) -> dict[str, dict[str, str]]:
    names = {e["process_group"][0] for e in entries if isinstance(e.get("process_group"), list) and e["process_group"]}
    names = {n for n in names if isinstance(n, str)}
    if len(names) == 1 and set(pg_config) == {""}:
        (name,) = names
        desc = next((str(e["process_group"][1]) for e in entries if len(e.get("process_group") or []) > 1), "")
        return {name: {**pg_config[""], "name": name, "desc": pg_config[""].get("desc") or desc}}
    return pg_config


def analyzer_dump(dump: FlightRecorderDump) -> dict[str, Any]:
    """One rank's file content, in the shape ``_dump_fr_trace`` returns."""
    entries = [dict(e) for e in dump.entries]
    for e in entries:  # the pickle holds the group as a tuple; the analyzer indexes it either way
        if isinstance(e.get("process_group"), list):
            e["process_group"] = tuple(e["process_group"])
    return {
        "version": dump.version or "2.10",
        "pg_config": fix_pg_config(dump.pg_config, dump.entries),
        "pg_status": {},
        "entries": entries,
    }


def write_dirs(sets: list[FrSet], root: str) -> list[str]:
    """One directory per fault under ``root``, ``rank_<r>`` per rank with a dump.
    Returns the directories written."""
    out = []
    for i, fs in enumerate(sets, 1):
        ranks = {r: d for r, d in fs.by_rank.items() if d.ok}
        if not ranks:
            continue
        d = os.path.join(root, f"{i:02d}-{fs.trigger.get('kind', 'evidence')}")
        os.makedirs(d, exist_ok=True)
        for r, dump in sorted(ranks.items()):
            path = os.path.join(d, f"{PREFIX}{r}")
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "wb") as fh:
                pickle.dump(analyzer_dump(dump), fh)
            os.replace(tmp, path)
        out.append(d)
    return out
