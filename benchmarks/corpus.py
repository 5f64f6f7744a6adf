"""Real, public training scripts run unmodified under ``watchdog run -- torchrun``
(2 ranks, gloo on CPU, a real agent and coordinator), healthy and with faults
injected from outside: SIGKILL, SIGSTOP and a noisy neighbour (a CPU hog pinned to
the rank's core). Prints a table: script, eval/checkpoint cycles, findings on the
healthy run, and each fault's first finding (kind, ranks, latency from injection);
advisory findings (``extra_work``, ``periodic_stall``: they never page) are listed apart
as advice and count against no run.

    python benchmarks/corpus.py --scripts-dir DIR [--only nanogpt,trl_sft] [--faults kill,stop,hog]

Where the scripts come from (nothing of them is in this repository):

- ``trl_sft``: ``trl/scripts/sft.py`` from the ``trl`` wheel on PyPI (``pip install trl==0.25.1``,
  needs ``datasets``; ``tensorboard`` for ``--report_to tensorboard``): Hugging Face
  ``Trainer`` (SFTTrainer) with step-based evaluation and saving, a 2-worker DataLoader,
  and rank 0 logging every step to a TensorBoard file.
- in ``--scripts-dir``, fetched by the user (the paths are those of a ``git clone``):
  ``nanoGPT/`` = https://github.com/karpathy/nanoGPT (train.py, model.py, configurator.py;
  measured at 3adf61e): the custom loop whose rank 0 alone evaluates (``estimate_loss``),
  checkpoints and prints every iteration (``loss.item()``);
  ``examples/`` = https://github.com/pytorch/examples
  (distributed/ddp-tutorial-series/multigpu_torchrun.py + datautils.py; 77f55b9): the
  PyTorch DDP tutorial, rank 0 alone saving a snapshot every few epochs;
  ``pytorch-lightning/`` = https://github.com/Lightning-AI/pytorch-lightning
  (examples/pytorch/basics/transformer.py and examples/fabric/language_model/train.py;
  7f0c343): a Lightning Trainer and a Fabric loop, both validating every epoch.
  A script that is not there is left out of the table, with a line saying so.

Unmodified means: the script's own file, its own command-line flags; the only edits are
the device lines a CUDA script needs to run on CPU (``DEVICE_EDITS``, applied to a copy,
each one required to match). Data and models are made locally (synthetic tokens, a tiny
model from a config, a word-level tokenizer): nothing is downloaded at run time.

The noisy neighbour pins the victim rank to one core with ``--hogs`` busy processes and the
other ranks to the remaining cores: on a host with other load (2 cores at load 10-12 here) that
load lands on the other ranks' cores too, so which rank really computes slower is the host's
doing as much as the hog's; read that column on a quiet host. A healthy run goes to the
script's end or 5 s past its third cycle. Latency is from the injection (wall clock) to the coordinator's journal record; the
machine is shared, so figures are under load. The job is stopped once a fault's finding
is in (plus a short linger that catches anyone else blamed) or after ``--fault-timeout``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.contracts import slot as wire
from watchdog.contracts.finding import ADVISORY_KINDS
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import inject, localjob

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}
FAULTS = ("kill", "stop", "hog")
EXPECTED = {"kill": "dead_rank", "stop": "frozen_rank", "hog": "straggler"}


@dataclass(frozen=True)
class Entry:
    name: str
    covers: str
    script: str  # relative to --scripts-dir, or "pkg:<module path>" for a script inside an installed package
    args: tuple[str, ...]
    cycle: str  # regex: one match (or distinct group) in the job's output per evaluation / checkpoint cycle
    prepare: Callable[[Path], None]  # writes the run's local data / model into its working directory
    edits: tuple[tuple[str, str], ...] = ()  # device lines for CPU: (exact old text, new text)
    fault_args: tuple[str, ...] = ()  # replaces args on fault runs: long enough to outlast a detection
    copy: tuple[str, ...] = ()  # sibling files the script imports or execs
    env: tuple[tuple[str, str], ...] = ()  # the framework's own settings by environment


# ---------------------------------------------------------------- local data, no downloads


def _words(n: int, vocab: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"w{rng.randrange(vocab)}" for _ in range(n)]


def prep_nanogpt(cwd: Path) -> None:
    import pickle

    import numpy as np

    d = cwd / "data" / "corpus"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 65, 200_000, dtype=np.uint16).tofile(d / "train.bin")
    rng.integers(0, 65, 20_000, dtype=np.uint16).tofile(d / "val.bin")
    (d / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65}))


def prep_wikitext(cwd: Path) -> None:
    # lightning.pytorch.demos.WikiText2 reads ./data/wikitext-2.txt and downloads only when it is missing;
    # 35-token samples: 4,000 go to validation and test, the rest (~400) to training.
    words = _words(35 * 4420, 100)
    (cwd / "data").mkdir()
    lines = (" ".join(words[i : i + 24]) for i in range(0, len(words), 24))
    (cwd / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")


def prep_sft(cwd: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2, **{f"w{i}": 3 + i for i in range(200)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    model_dir = cwd / "model"
    fast.save_pretrained(model_dir)
    cfg = GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=64, n_layer=2, n_head=2, eos_token_id=2)
    cfg.pad_token_id = 0
    GPT2LMHeadModel(cfg).save_pretrained(model_dir)
    data = cwd / "data"
    data.mkdir()
    for split, n, seed in (("train", 4000, 1), ("test", 2000, 2)):
        rng = random.Random(seed)
        rows = (json.dumps({"text": " ".join(f"w{rng.randrange(200)}" for _ in range(40))}) for _ in range(n))
        (data / f"{split}.jsonl").write_text("\n".join(rows) + "\n")


def prep_nothing(cwd: Path) -> None:
    return None


NANOGPT_ARGS = (
    "--device=cpu",
    "--backend=gloo",
    "--compile=False",
    "--dtype=float32",
    "--dataset=corpus",
    "--batch_size=8",
    "--block_size=64",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=64",
    "--gradient_accumulation_steps=2",
    "--eval_interval=100",
    "--eval_iters=300",
    "--log_interval=1",
    "--always_save_checkpoint=True",
    "--warmup_iters=10",
    "--lr_decay_iters=2000",
    "--out_dir=out",
)
SFT_ARGS = (
    "--model_name_or_path=model",
    "--dataset_name=data",
    "--output_dir=out",
    "--per_device_train_batch_size=8",
    "--per_device_eval_batch_size=8",
    "--eval_strategy=steps",
    "--eval_steps=100",
    "--save_strategy=steps",
    "--save_steps=100",
    "--logging_steps=1",
    "--report_to=tensorboard",
    "--dataloader_num_workers=2",
    "--use_cpu=true",
    "--ddp_backend=gloo",
    "--max_length=64",
    "--learning_rate=1e-3",
    "--disable_tqdm=true",
    "--seed=0",
)

ENTRIES: tuple[Entry, ...] = (
    Entry(
        "nanogpt",
        "custom loop; rank 0 alone evaluates (no_grad, eval mode), checkpoints, prints every step",
        "nanoGPT/train.py",
        (*NANOGPT_ARGS, "--max_iters=300"),
        r"^step \d+: train loss",
        prep_nanogpt,
        edits=(
            ("device = f'cuda:{ddp_local_rank}'", "device = 'cpu'"),
            ("torch.cuda.set_device(device)", "pass"),
            ("model = DDP(model, device_ids=[ddp_local_rank])", "model = DDP(model)"),
        ),
        fault_args=(*NANOGPT_ARGS, "--max_iters=3000"),
        copy=("model.py", "configurator.py"),
    ),
    Entry(
        "ddp_tutorial",
        "custom loop (pytorch/examples DDP tutorial); rank 0 alone saves a snapshot every 20 epochs",
        "examples/distributed/ddp-tutorial-series/multigpu_torchrun.py",
        ("200", "20"),
        r"Training snapshot saved",
        prep_nothing,
        edits=(
            ('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))', "pass"),
            ('init_process_group(backend="nccl")', 'init_process_group(backend="gloo")'),
            ("self.model = model.to(self.gpu_id)", "self.model = model"),
            ("DDP(self.model, device_ids=[self.gpu_id])", "DDP(self.model)"),
            ("source = source.to(self.gpu_id)", "source = source"),
            ("targets = targets.to(self.gpu_id)", "targets = targets"),
        ),
        fault_args=("2000", "20"),
        copy=("datautils.py",),
    ),
    Entry(
        "lightning",
        "Lightning Trainer, validation every epoch (all ranks), 20 epochs",
        "pytorch-lightning/examples/pytorch/basics/transformer.py",
        (),
        r"Epoch (\d+): 100%[^\r\n]*val_loss",
        prep_wikitext,
        # The script builds ``L.Trainer(gradient_clip_val=0.25, max_epochs=20)``; Lightning reads
        # the arguments a script leaves out from PL_TRAINER_*: 2-process DDP on CPU, and 20
        # validation batches per epoch instead of 2,000 samples' worth.
        env=(
            ("PL_TRAINER_ACCELERATOR", "cpu"),
            ("PL_TRAINER_DEVICES", "2"),
            ("PL_TRAINER_STRATEGY", "ddp"),
            ("PL_TRAINER_LIMIT_VAL_BATCHES", "20"),
        ),
    ),
    Entry(
        "fabric",
        "Lightning Fabric custom loop, validation every epoch (all ranks, eval mode, no_grad)",
        "pytorch-lightning/examples/fabric/language_model/train.py",
        (),
        r"^val loss",
        prep_wikitext,
        # ``L.Fabric()`` with no arguments and no ``launch()``: the script is meant for ``fabric run``,
        # which sets LT_* (the arguments) and LT_CLI_USED, then runs torchrun
        env=(("LT_ACCELERATOR", "cpu"), ("LT_DEVICES", "2"), ("LT_STRATEGY", "ddp"), ("LT_CLI_USED", "1")),
    ),
    Entry(
        "trl_sft",
        "HF Trainer (SFTTrainer): eval + save every 100 steps, 2 loader workers, rank 0 logs every step to a file",
        "pkg:trl/scripts/sft.py",
        (*SFT_ARGS, "--max_steps=300"),
        r"'eval_loss'",
        prep_sft,
        fault_args=(*SFT_ARGS, "--max_steps=2000"),
    ),
)


def resolve(entry: Entry, scripts_dir: Path | None) -> Path | None:
    """The script's path, or None when it is not available here."""
    if entry.script.startswith("pkg:"):
        rel = entry.script[4:]
        spec = importlib.util.find_spec(rel.split("/")[0])
        if spec is None or spec.origin is None:
            return None
        path = Path(spec.origin).parent.parent / rel
        return path if path.exists() else None
    if scripts_dir is None:
        return None
    path = scripts_dir / entry.script
    return path if path.exists() else None


def stage(entry: Entry, source: Path, cwd: Path) -> Path:
    """The script to run: in place for a package's script (no edits), else a copy with the
    device edits, beside the files it imports; the entry's local data in ``cwd``."""
    entry.prepare(cwd)
    if entry.script.startswith("pkg:"):
        return source
    text = source.read_text()
    for old, new in entry.edits:
        if old not in text:
            raise RuntimeError(f"{entry.name}: device edit no longer matches {source}: {old!r}")
        text = text.replace(old, new)
    dest = cwd / source.name
    dest.write_text(text)
    for name in entry.copy:
        shutil.copy(source.parent / name, cwd / name)
    return dest


# ---------------------------------------------------------------- one monitored run


@dataclass
class Run:
    """Coordinator, agent and ``watchdog run -- torchrun`` of one corpus script."""

    entry: Entry
    source: Path
    tmp: Path
    args: Sequence[str]
    nproc: int = 2
    procs: list[localjob.Process] = field(default_factory=list)
    job: localjob.TorchrunJob | None = None

    @property
    def journal_path(self) -> Path:
        return self.tmp / "journal.jsonl"

    def start(self) -> Run:
        name = f"corpus-{self.entry.name}-{secrets.token_hex(3)}"
        cwd, run_dir = self.tmp / "cwd", self.tmp / "run"
        cwd.mkdir(parents=True)
        run_dir.mkdir()
        script = stage(self.entry, self.source, cwd)
        token = self.tmp / "token"
        token.write_text(secrets.token_hex(16))
        env = {**os.environ, **OFFLINE, **dict(self.entry.env), "WATCHDOG_JOB_TOKEN_FILE": str(token)}
        coord = localjob.start_coordinator(
            self.tmp, name, self.nproc, self.journal_path, env=env, extra=["--tick.interval-seconds", "0.25"]
        )
        self.procs.append(coord)
        agent_flags = ["--coordinator.url", coord.url, "--report.interval-seconds", "0.25"]
        self.procs.append(localjob.start_agent(self.tmp, run_dir, name, env=env, extra=agent_flags))
        self.job = localjob.TorchrunJob(
            nproc=self.nproc,
            run_dir=run_dir,
            job=name,
            work_dir=self.tmp,
            script=script,
            script_args=list(self.args),
            env=env,
            prefix=localjob.WATCHDOG_RUN,
            cwd=cwd,
        ).start()
        return self

    def output(self) -> str:
        assert self.job is not None and self.job.proc is not None
        return self.job.proc.log()

    def cycles(self) -> int:
        """Matches of the entry's pattern; distinct ones when it has a group (a progress bar
        redraws its last line)."""
        found = re.findall(self.entry.cycle, self.output(), re.MULTILINE)
        return len(set(found)) if re.compile(self.entry.cycle).groups else len(found)

    def findings(self, advice: bool = False) -> list[dict]:
        """The findings journaled so far; with ``advice``, the advisory ones instead
        (they explain and never page: not counted against a run)."""
        try:
            records = journal.read(str(self.journal_path))
        except OSError:
            return []
        return [r for r in records if r["event"] == je.FINDING and (r["kind"] in ADVISORY_KINDS) == advice]

    def step(self, rank: int) -> int:
        assert self.job is not None
        pid = self.job.rank_pids().get(rank)
        for path in wire.list_slot_files(str(self.job.run_dir)):
            try:
                header = wire.read_slot(path).header
            except (wire.SlotError, OSError):
                continue
            if header.identity.pid == pid:
                return header.words[wire.H_STEP]
        return -1

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()
        for p in reversed(self.procs):
            p.stop(grace_s=3.0)


def _wait(pred: Callable[[], object], timeout_s: float, run: Run) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if run.job is not None and run.job.proc is not None and not run.job.proc.alive():
            return pred()
        time.sleep(0.1)
    return None


@dataclass
class Outcome:
    findings: list[dict]
    cycles: int
    exit_code: int | None = None
    seconds: float = 0.0
    injected_at: float | None = None
    before: list[dict] = field(default_factory=list)  # findings journaled before the injection
    advice: list[dict] = field(default_factory=list)  # advisory findings over the whole run

    def first(self) -> dict | None:
        return self.findings[0] if self.findings else None

    def latency(self) -> float | None:
        first = self.first()
        return None if first is None or self.injected_at is None else first["t_wall"] - self.injected_at

    def blamed(self) -> set[int]:
        return {r for f in self.findings for r in f["ranks"]}


def healthy(entry: Entry, source: Path, tmp: Path, timeout_s: float, cycles: int = 3) -> Outcome:
    """Run the script to its end, or until ``cycles`` evaluation/checkpoint cycles
    are behind it and 5 s more (exit code None then)."""
    run = Run(entry, source, tmp, entry.args)
    t0 = time.monotonic()
    try:
        run.start()
        assert run.job is not None and run.job.proc is not None
        _wait(lambda: run.cycles() >= cycles, timeout_s, run)
        proc = run.job.proc.popen
        if proc.poll() is None:
            time.sleep(5.0)
        code = proc.poll()
        time.sleep(1.0)  # the coordinator's last ticks over the final reports
        return Outcome(run.findings(), run.cycles(), code, time.monotonic() - t0, advice=run.findings(advice=True))
    finally:
        run.stop()


def faulted(
    entry: Entry,
    source: Path,
    tmp: Path,
    fault: str,
    rank: int,
    timeout_s: float,
    linger_s: float = 3.0,
    after_cycles: int = 1,
    hogs: int = 1,
) -> Outcome:
    """Start the job, wait for ``after_cycles`` evaluation/checkpoint cycles, inject
    ``fault`` on ``rank``, and collect the findings journaled after the injection (those
    before it in ``before``: a healthy stretch of the same run)."""
    run = Run(entry, source, tmp, entry.fault_args or entry.args)
    hog: inject.NoisyNeighbour | None = None
    try:
        run.start()
        assert run.job is not None
        ready = _wait(lambda: run.cycles() >= after_cycles and len(run.job.rank_pids()) >= run.nproc, 240, run)  # type: ignore[union-attr]
        if not ready:
            return Outcome([], run.cycles(), run.job.proc.popen.poll() if run.job.proc else None)
        start_step = run.step(rank)
        _wait(lambda: run.step(rank) >= start_step + 5, 30, run)  # back in training after the cycle
        pids = run.job.rank_pids()
        victim = pids[rank]
        before = run.findings()
        if fault == "kill":
            at = inject.kill(victim)
        elif fault == "stop":
            at = inject.stop(victim)
        else:
            cpus = sorted(os.sched_getaffinity(0))
            hog = inject.NoisyNeighbour(cpus[rank % len(cpus)], hogs)
            at = hog.start(victim, [p for r, p in pids.items() if r != rank])
        after = lambda: [f for f in run.findings() if f["t_wall"] >= at]  # noqa: E731
        # Wait for the fault's own finding, not the first one: a false one before it would hide it.
        _wait(lambda: any(f["kind"] == EXPECTED[fault] and rank in f["ranks"] for f in after()), timeout_s, run)
        if after():
            time.sleep(linger_s)
        return Outcome(after(), run.cycles(), None, 0.0, at, before, run.findings(advice=True))
    finally:
        if hog is not None:
            hog.stop()
        run.stop()


# ---------------------------------------------------------------- table


def _f(findings: list[dict]) -> str:
    if not findings:
        return "0"
    counts: dict[str, int] = {}
    for f in findings:
        key = f"{f['kind']}{f['ranks']}"
        counts[key] = counts.get(key, 0) + 1
    return f"{len(findings)}: " + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in counts.items())


def _advice(out: Outcome) -> str:
    return f" (advice: {_f(out.advice)})" if out.advice else ""


def cell(out: Outcome, fault: str, rank: int) -> str:
    """The fault's own finding and its latency; WRONG when anything else came first or
    another rank was blamed (listed after a +), MISSED when it never came."""
    if out.injected_at is None:
        return "not injected"
    own = next((f for f in out.findings if f["kind"] == EXPECTED[fault] and f["ranks"] == [rank]), None)
    others = [f"{f['kind']}{f['ranks']} {f['t_wall'] - out.injected_at:.1f}s" for f in out.findings if f is not own]
    text = "MISSED" if own is None else f"{own['kind']}{own['ranks']} {own['t_wall'] - out.injected_at:.1f}s"
    if others:
        text += " + " + ", ".join(others)
    if own is None and not others:
        return text
    return text if own is not None and own is out.first() and out.blamed() == {rank} else f"WRONG {text}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _dir(keep: Path | None, tmp: str, name: str, run: str) -> Path:
    return (keep / name / run) if keep is not None else Path(tmp) / run


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts-dir", type=Path, default=os.environ.get("WATCHDOG_CORPUS_DIR"))
    p.add_argument("--only", default="", help="comma-separated entry names")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--rank", type=int, default=1, help="the rank each fault is injected into")
    p.add_argument("--healthy-timeout", type=float, default=400.0)
    p.add_argument("--skip-healthy", action="store_true", help="fault runs only")
    p.add_argument("--hogs", type=int, default=1, help="busy processes on the victim's core (a loaded host needs more)")
    p.add_argument("--fault-timeout", type=float, default=90.0)
    p.add_argument("--json", type=Path, default=None, help="also write the raw outcomes here")
    p.add_argument("--work-dir", type=Path, default=None, help="keep every run's logs and journal here")
    args = p.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    faults = [f for f in args.faults.split(",") if f]
    rows: list[list[str]] = []
    raw: dict[str, dict] = {}
    t0 = time.monotonic()
    for entry in ENTRIES:
        if only and entry.name not in only:
            continue
        source = resolve(entry, args.scripts_dir)
        if source is None:
            print(f"{entry.name}: {entry.script} not found (see --help for where to get it); left out", flush=True)
            continue
        row, raw[entry.name] = [entry.name, "-", "skipped", "-"], {}
        if not args.skip_healthy:
            with tempfile.TemporaryDirectory(prefix=f"corpus-{entry.name}-") as tmp:
                h = healthy(entry, source, _dir(args.work_dir, tmp, entry.name, "healthy"), args.healthy_timeout)
            print(f"{entry.name} healthy: exit {h.exit_code}, {h.cycles} cycles, {h.seconds:.0f} s, {_f(h.findings)}")
            ended = {0: "ok", None: "stopped"}.get(h.exit_code, f"exit {h.exit_code}")
            row = [entry.name, str(h.cycles), f"{ended} {h.seconds:.0f}s", _f(h.findings) + _advice(h)]
            raw[entry.name]["healthy"] = h.__dict__
        for fault in faults:
            with tempfile.TemporaryDirectory(prefix=f"corpus-{entry.name}-{fault}-") as tmp:
                where = _dir(args.work_dir, tmp, entry.name, fault)
                out = faulted(entry, source, where, fault, args.rank, args.fault_timeout, hogs=args.hogs)
            row.append(
                cell(out, fault, args.rank) + (f" (before: {_f(out.before)})" if out.before else "") + _advice(out)
            )
            raw[entry.name][fault] = out.__dict__
            print(f"{entry.name} {fault}: {row[-1]}", flush=True)
        rows.append(row)
    (lambda p: p and p.write_text(json.dumps(raw, indent=1, default=str)))(args.json)
    heads = ["script", "cycles", "healthy run", "healthy findings", *[f"{f} r{args.rank}" for f in faults]]
    print(f"\nCorpus: 2 gloo ranks on CPU under `watchdog run -- torchrun` ({time.monotonic() - t0:.0f} s)\n")
    print(table(heads, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
