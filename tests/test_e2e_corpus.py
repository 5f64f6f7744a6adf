"""Real, public training scripts, unmodified, under ``watchdog run -- torchrun`` (2 gloo
ranks on CPU, a real agent and coordinator): a healthy stretch of at least two
evaluation/checkpoint cycles pages nobody, then a fault injected from outside in the
same run is named on the right rank alone. The scripts and their local data are
``benchmarks/corpus.py``'s (the full corpus with every fault is that benchmark).

- ``trl/scripts/sft.py`` (the trl wheel from PyPI): Hugging Face's Trainer with
  evaluation and saving every 100 steps, two DataLoader workers, rank 0 logging every
  step to a TensorBoard file; then rank 1 SIGSTOPped -> frozen_rank [1].
- nanoGPT's ``train.py``, where ``WATCHDOG_CORPUS_DIR`` holds a clone of it (see the
  benchmark's docstring; skipped otherwise): rank 0 alone evaluates and checkpoints
  every 100 iterations while rank 1 waits in DDP's all-reduce; then rank 1 SIGKILLed
  -> dead_rank [1].
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import corpus

pytestmark = pytest.mark.integration

ENTRIES = {e.name: e for e in corpus.ENTRIES}


def _source(name: str) -> Path:
    scripts_dir = os.environ.get("WATCHDOG_CORPUS_DIR")
    source = corpus.resolve(ENTRIES[name], Path(scripts_dir) if scripts_dir else None)
    if source is None:
        pytest.skip(f"{ENTRIES[name].script} is not here (benchmarks/corpus.py says where to get it)")
    return source


def _check(out: corpus.Outcome, kind: str, rank: int) -> None:
    summary = [(f["kind"], f["ranks"]) for f in out.findings]
    assert out.cycles >= 2, out.cycles
    assert out.before == [], [(f["kind"], f["ranks"], f["reason"]) for f in out.before]
    assert out.injected_at is not None
    first = out.first()
    assert first is not None, f"no finding after the {kind} fault"
    assert (first["kind"], first["ranks"]) == (kind, [rank]), summary
    assert out.blamed() == {rank}, summary
    print(f"\n{kind} [{rank}] after {out.latency():.2f} s, {out.cycles} cycles: {first['reason'][:160]}")


def test_hf_trainer_script_is_quiet_through_its_evaluations_and_a_stopped_rank_is_named(tmp_path):
    pytest.importorskip("trl")
    out = corpus.faulted(ENTRIES["trl_sft"], _source("trl_sft"), tmp_path, "stop", 1, 60, after_cycles=2)
    _check(out, "frozen_rank", 1)


def test_nanogpt_rank0_evaluating_alone_pages_nobody_and_a_killed_rank_is_named(tmp_path):
    out = corpus.faulted(ENTRIES["nanogpt"], _source("nanogpt"), tmp_path, "kill", 1, 60, after_cycles=2)
    _check(out, "dead_rank", 1)
