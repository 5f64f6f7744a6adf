"""A small real DDP training job on CPU/gloo with rank-watchdog's hook installed.

What a newcomer copies: the three lines marked ``# watchdog`` are all the hook
needs. Run it under torchrun:

    torchrun --nproc_per_node=4 examples/train_ddp.py --steps 200

The model is tiny so that four ranks fit on a 2-core laptop; ``--compute-ms``
adds a fixed sleep per step standing in for a heavier model's forward/backward,
so step times look like real training (0.05-1 s) without burning the CPUs.

``--fault SPEC`` injects faults for tests and demos (repeatable):

    kill:R@S     rank R SIGKILLs itself at the start of step S
    exit:R@S     rank R leaves the loop and exits cleanly (status 0) at the start of
                 step S while the others go on into its all-reduce: uneven inputs,
                 an early return on one rank (on gloo they fail at once)
    stop:R@S     rank R SIGSTOPs itself at the start of step S
    hang:R@S     rank R sleeps forever just before the gradient all-reduce of
                 step S (after forward, before backward) while the others wait in it
    slow:R:F     rank R's compute is F times slower (e.g. 1.1)
    never-join:R rank R never calls init_process_group
    starve:R     rank R's data loader is slow (--starve-ms per batch)
    starve:all   every rank's data loader is slow
    loader-hang:R@S  rank R's data loader blocks forever fetching the batch of
                 step S (the others wait in that step's all-reduce)
    nan:R@S      rank R's loss is NaN at step S (a corrupted batch or a flipped
                 bit): its NaN gradient reaches every rank at the all-reduce
    raise:R@S    rank R raises ZeroDivisionError in its loss scaling at step S
    oom:R@S      rank R allocates memory until it is stopped, at step S. With
                 WATCHDOG_FAULT_CGROUP (a memory-limited cgroup directory) every
                 rank joins it at start, as in a container, and the kernel
                 OOM-kills rank R there; without it, rank R grows under an
                 address-space limit 256 MiB above its size (a MemoryError).
                 Never the whole machine's memory.
    mismatch:R@S[:N]  every rank all-reduces an extra tensor at step S, rank R
                 one of N elements (default 1000), the others 4: a desync. gloo
                 aborts a healthy rank first at N=1000 and hangs at N=6

Faults are injected in the first attempt only (TORCHELASTIC_RESTART_COUNT 0),
unless --faults-every-attempt (a deterministic failure that comes back).

Rollback. After a ``rollback_restart`` (the coordinator's answer to a NaN or a
loss spike), the run directory holds a rollback file naming the first bad step
(watchdog.hook.rollback); the script then resumes from its newest checkpoint
strictly before that step, once per rollback (``honour_rollback``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Subset
from torch.utils.data.distributed import DistributedSampler

from watchdog.hook import install, rollback  # watchdog


@dataclass
class Faults:
    kill: dict[int, int] = field(default_factory=dict)  # rank -> step
    exit: dict[int, int] = field(default_factory=dict)
    stop: dict[int, int] = field(default_factory=dict)
    hang: dict[int, int] = field(default_factory=dict)
    slow: dict[int, float] = field(default_factory=dict)  # rank -> factor
    never_join: set[int] = field(default_factory=set)
    starve: set[int] = field(default_factory=set)
    starve_all: bool = False
    loader_hang: dict[int, int] = field(default_factory=dict)  # rank -> step
    nan: dict[int, int] = field(default_factory=dict)  # rank -> step
    raise_: dict[int, int] = field(default_factory=dict)  # rank -> step
    oom: dict[int, int] = field(default_factory=dict)
    mismatch: dict[int, int] = field(default_factory=dict)  # rank -> step: all-reduces another size there
    mismatch_elements: int = 1000


def announce(kind: str, rank: int, step: int) -> None:
    """One machine-readable line per injected fault (its true onset), for benchmarks."""
    print("WATCHDOG_FAULT " + json.dumps({"kind": kind, "rank": rank, "step": step, "t_wall": time.time()}), flush=True)


def parse_faults(specs: list[str]) -> Faults:
    faults = Faults()
    for spec in specs:
        try:
            kind, _, rest = spec.partition(":")
            if kind == "mismatch":
                rank, _, rest = rest.partition("@")
                step, _, elements = rest.partition(":")
                faults.mismatch[int(rank)] = int(step)
                faults.mismatch_elements = int(elements or 1000)
            elif kind in ("kill", "exit", "stop", "hang", "loader-hang", "nan", "raise", "oom"):
                rank, _, step = rest.partition("@")
                attr = {"raise": "raise_"}.get(kind, kind.replace("-", "_"))
                getattr(faults, attr)[int(rank)] = int(step)
            elif kind == "slow":
                rank, _, factor = rest.partition(":")
                faults.slow[int(rank)] = float(factor)
            elif kind == "never-join":
                faults.never_join.add(int(rest))
            elif kind == "starve":
                if rest == "all":
                    faults.starve_all = True
                else:
                    faults.starve.add(int(rest))
            else:
                raise ValueError(f"unknown fault kind {kind!r}")
        except ValueError as exc:
            raise SystemExit(f"--fault {spec!r}: {exc} (see --help for the forms)") from None
    return faults


def loss_scale(step: int, broken: bool) -> float:
    """The raise fault's place: a bug in the user's own code."""
    return 1.0 / (0 if broken else 1)


def join_fault_cgroup() -> None:
    """The oom fault's confinement: the job runs in a memory-limited cgroup."""
    cgroup = os.environ.get("WATCHDOG_FAULT_CGROUP")
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))


def blow_up_memory() -> None:
    """The oom fault: grow until stopped, confined (see the module doc)."""
    if not os.environ.get("WATCHDOG_FAULT_CGROUP"):
        import resource

        with open("/proc/self/statm") as fh:
            size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
    hoard = []
    while True:
        hoard.append(bytearray(32 << 20))  # zero-filled: every page touched


class SyntheticRegression(Dataset):
    """Deterministic samples from the index alone, so a resumed run sees the same data."""

    def __init__(self, n: int, dim: int, delay_s: float = 0.0) -> None:
        self.n, self.dim, self.delay_s = n, dim, delay_s
        gen = torch.Generator().manual_seed(1234)
        self.w_true = torch.randn(dim, 1, generator=gen)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        gen = torch.Generator().manual_seed(i)
        x = torch.randn(self.dim, generator=gen)
        return x, x @ self.w_true + 0.01 * torch.randn(1, generator=gen)


class BlockingAt(Dataset):
    """The loader-hang fault: sample ``at`` and later never arrive, as with a
    reader stuck on a dead network filesystem."""

    def __init__(self, inner: Dataset, at: int, rank: int, step: int) -> None:
        self.inner, self.at, self.rank, self.step = inner, at, rank, step

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i >= self.at:
            announce("loader-hang", self.rank, self.step)
            while True:
                time.sleep(3600)
        return self.inner[i]


def init_process_group(timeout_s: float, plain: bool = False) -> None:
    """gloo init on a store prefixed with torchelastic's restart count: restarted
    workers must not read the peer addresses the previous attempt left in the
    agent's store (otherwise gloo's connectFullMesh is refused after a restart).
    ``plain``: what an unmodified script does, which may not come back from a restart (tests of a
    restart that fails). Without the agent's store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    the way for multi-node restarts: README) rank 0 hosts a fresh store each attempt,
    and the plain init is the right one."""
    if plain or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "True":
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"attempt{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def latest_checkpoint(ckpt_dir: str | None, before: int | None = None) -> tuple[int, str | None]:
    """The newest checkpoint (strictly before step ``before``, when given)."""
    if not ckpt_dir or not os.path.isdir(ckpt_dir):
        return 0, None
    steps = [int(n[5:-3]) for n in os.listdir(ckpt_dir) if n.startswith("step-") and n.endswith(".pt")]
    steps = [s for s in steps if before is None or s < before]
    if not steps:
        return 0, None
    best = max(steps)
    return best, os.path.join(ckpt_dir, f"step-{best:08d}.pt")


def honour_rollback(mon: object, ckpt_dir: str | None) -> tuple[int, str | None]:
    """The checkpoint to resume from: the newest, or after a rollback_restart the
    newest before the anomaly, once per rollback. Every rank decides before any
    rank marks the rollback done (the barrier), so they all load the same one."""
    rb = rollback.requested(mon)  # watchdog: None unless the coordinator rolled the job back
    marker = os.path.join(ckpt_dir, f"rollback-{rb.action}.done") if rb and ckpt_dir else ""
    if rb is None or ckpt_dir is None or not marker or os.path.exists(marker):
        dist.barrier()
        return latest_checkpoint(ckpt_dir)
    step, path = latest_checkpoint(ckpt_dir, before=rb.before_step)
    print(f"[rank {dist.get_rank()}] rollback {rb.action}: resuming before step {rb.before_step}", flush=True)
    dist.barrier()
    if dist.get_rank() == 0:  # checkpoints from the anomaly on hold its state: set them aside
        for name in os.listdir(ckpt_dir):
            if name.startswith("step-") and name.endswith(".pt") and int(name[5:-3]) >= rb.before_step:
                os.replace(os.path.join(ckpt_dir, name), os.path.join(ckpt_dir, name + ".rolled-back"))
        with open(marker, "w") as f:
            f.write(str(step))
    return step, path


def save_checkpoint(ckpt_dir: str, step: int, model: DDP, opt: torch.optim.Optimizer) -> None:
    """Rank 0 writes atomically (tmp + rename): a rank killed mid-save leaves no half file."""
    if dist.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        path = os.path.join(ckpt_dir, f"step-{step:08d}.pt")
        torch.save({"step": step, "model": model.module.state_dict(), "opt": opt.state_dict()}, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="train until this many steps are done")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--compute-ms", type=float, default=50.0, help="simulated extra compute per step")
    p.add_argument("--jitter", type=float, default=0.0, help="random +-fraction on each rank's compute per step")
    p.add_argument(
        "--starve-ms",
        type=float,
        default=0.0,
        help="data delay per sample for starve faults (default: 4x compute per batch)",
    )
    p.add_argument(
        "--comm-mb",
        type=float,
        default=0.0,
        help="an extra all-reduce of this many MB every step (a communication-bound job)",
    )
    p.add_argument(
        "--until-file", default=None, help="stop cleanly once this file exists, every rank at the same step (tests)"
    )
    p.add_argument("--ckpt-dir", default=None, help="save/resume checkpoints here")
    p.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every N steps (0 = never)")
    p.add_argument("--ckpt-pause-s", type=float, default=0.0, help="extra time a checkpoint takes (tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pg-timeout-s", type=float, default=1800.0, help="gloo timeout (default: gloo's 30 min)")
    p.add_argument("--fault", action="append", default=[], help="inject a fault (see above)")
    p.add_argument(
        "--faults-every-attempt",
        action="store_true",
        help="inject the faults after a restart too (a deterministic failure)",
    )
    p.add_argument(
        "--plain-init",
        action="store_true",
        help="plain init_process_group, as an unmodified script: a restarted group may read the peer"
        " addresses of the previous attempt and fail to rejoin (not always: torch's store reads decide)",
    )
    p.add_argument(
        "--late-rejoin-s",
        type=float,
        default=0.0,
        help="after a restart the last rank starts init this much later, as a rank stuck reading"
        " its checkpoint would; past the monitor's resume timeout the restart fails (tests of a"
        " restart that fails)",
    )
    p.add_argument(
        "--buffers",
        action="store_true",
        help="a BatchNorm in the model: DDP broadcasts its buffers in every forward, from C++",
    )
    p.add_argument(
        "--final-params",
        default=None,
        help="rank 0 saves the final parameters here (torch.save of a name -> tensor dict)",
    )
    args = p.parse_args(argv)
    faults = parse_faults(args.fault)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarted and not args.faults_every_attempt:
        faults = Faults()  # injected in the first attempt only: a restarted job is the recovered one

    rank, launched_world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)  # 4 ranks share 2 cores
    if faults.oom:
        join_fault_cgroup()
    mon = install()  # watchdog: reads RANK/WORLD_SIZE and WATCHDOG_* from the env

    if rank in faults.never_join:
        print(f"[rank {rank}] fault never-join: not calling init_process_group", flush=True)
        announce("never-join", rank, 0)
        while True:
            time.sleep(3600)

    if restarted and args.late_rejoin_s and rank == launched_world - 1:
        time.sleep(args.late_rejoin_s)
    with mon.phase("init"):
        init_process_group(args.pg_timeout_s, plain=args.plain_init)
    world = dist.get_world_size()

    torch.manual_seed(args.seed)
    # With --buffers, DDP's _pre_forward broadcasts the BatchNorm statistics in every forward: a
    # collective issued from C++, which the hook's patching does not see (the Flight Recorder does).
    norm = [nn.BatchNorm1d(128)] if args.buffers else []
    model = DDP(nn.Sequential(nn.Linear(args.dim, 128), *norm, nn.ReLU(), nn.Linear(128, 1)))
    mon.watch_ddp(model)  # watchdog: times DDP's gradient all-reduce
    mon.watch_model(
        model, opt := torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )  # watchdog: forward/backward/optimizer

    with mon.phase("init"):
        start_step, path = honour_rollback(mon, args.ckpt_dir)
    if path:
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        print(f"[rank {rank}] resumed from step {start_step} ({path})", flush=True)
    mon.set_step(start_step)  # watchdog: keep the job's own step numbering across restarts
    with mon.phase("init"):
        # DDP reduces its first backward without buckets and rebuilds them after it: a
        # run resumed at step S would sum step S+1's gradients in another order than an
        # uninterrupted run (last-bit differences). One zero backward, no optimizer step,
        # puts every real step on the rebuilt buckets: resumes are bit-exact.
        model(torch.zeros(2, args.dim)).sum().mul(0.0).backward()  # 2 rows: a BatchNorm (--buffers) needs them
        opt.zero_grad(set_to_none=True)
    if args.ckpt_dir:
        # watchdog: a checkpoint on request (checkpoint_restart), in the periodic format,
        # so a resume works from either. Runs on every rank at the same step boundary.
        mon.register_checkpoint(lambda at: save_checkpoint(args.ckpt_dir, at, model, opt))

    starving = faults.starve_all or rank in faults.starve
    delay_s = 0.0
    if starving:
        per_batch = args.starve_ms / 1000 * args.batch_size if args.starve_ms else 4 * args.compute_ms / 1000
        delay_s = per_batch / args.batch_size
    # One pass over a large synthetic dataset; the sample order is fixed by the
    # seed, so a run resumed at step S trains on exactly the batches a fault-free
    # run would have seen from step S on.
    dataset = SyntheticRegression(n=max(1 << 16, args.steps * args.batch_size * world), dim=args.dim, delay_s=delay_s)
    order: list[int] = list(DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed))
    remaining: Dataset = Subset(dataset, order[start_step * args.batch_size : args.steps * args.batch_size])
    if rank in faults.loader_hang:
        at = faults.loader_hang[rank]
        remaining = BlockingAt(remaining, (at - start_step) * args.batch_size, rank, at)
    loader = DataLoader(remaining, batch_size=args.batch_size, shuffle=False, num_workers=0)
    jitter = random.Random(args.seed * 1000 + rank)
    compute_s = args.compute_ms / 1000 * faults.slow.get(rank, 1.0)

    if rank in faults.slow:
        announce("slow", rank, start_step)
    if starving:
        announce("starve", rank, start_step)
    # A large all-reduce on a small compute: what a big model on a slow interconnect looks like.
    comm = torch.zeros(int(args.comm_mb * (1 << 20)) // 4) if args.comm_mb > 0 else None
    step = start_step
    for x, y in mon.wrap_loader(
        loader, device="cpu"
    ):  # watchdog: times the data wait (and the copy to the device: ~0 on CPU)
        if faults.kill.get(rank) == step:
            announce("kill", rank, step)
            os.kill(os.getpid(), signal.SIGKILL)
        if faults.exit.get(rank) == step:
            announce("exit", rank, step)
            sys.exit(0)
        if faults.stop.get(rank) == step:
            announce("stop", rank, step)
            os.kill(os.getpid(), signal.SIGSTOP)
        if faults.oom.get(rank) == step:
            announce("oom", rank, step)
            blow_up_memory()
        loss = nn.functional.mse_loss(model(x), y)
        if faults.nan.get(rank) == step:
            announce("nan", rank, step)
            loss = loss * float("nan")
        if rank in faults.raise_:
            if faults.raise_[rank] == step:
                announce("raise", rank, step)
            loss = loss * loss_scale(step, faults.raise_[rank] == step)
        if compute_s:
            time.sleep(compute_s * (1 + jitter.uniform(-args.jitter, args.jitter)))
        if faults.hang.get(rank) == step:
            announce("hang", rank, step)
            while True:
                time.sleep(3600)
        if step in faults.mismatch.values():  # every rank all-reduces; the odd one another size
            odd = faults.mismatch.get(rank) == step
            announce("mismatch", rank, step) if odd else None
            dist.all_reduce(torch.ones(faults.mismatch_elements if odd else 4))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradients in here
        if comm is not None:
            dist.all_reduce(comm)
        opt.step()
        step += 1
        if args.ckpt_dir and args.ckpt_every and step % args.ckpt_every == 0:
            with mon.phase("checkpoint"):
                save_checkpoint(args.ckpt_dir, step, model, opt)
                if args.ckpt_pause_s:
                    time.sleep(args.ckpt_pause_s)
        mon.step(loss=loss.item())  # watchdog: marks the step boundary (the loss is optional)
        if rank == 0 and step % 20 == 0:
            print(f"[rank 0] step {step} loss {loss.item():.4f}", flush=True)
        if args.until_file:  # the ranks agree on when to stop: each sees the file at its own time
            seen = torch.tensor([float(os.path.exists(args.until_file))])
            dist.all_reduce(seen, op=dist.ReduceOp.MAX)
            if seen.item():
                break

    if args.ckpt_dir and args.ckpt_every and step % args.ckpt_every:
        with mon.phase("checkpoint"):
            save_checkpoint(args.ckpt_dir, step, model, opt)
    if rank == 0:
        digest = sum(float(p.double().sum()) for p in model.module.parameters())
        print(f"[rank 0] done: {step} steps, parameter checksum {digest:.10f}", flush=True)
        if args.final_params:
            torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, args.final_params)
    # Leave together: a rank tearing gloo down while a peer is still saving can
    # abort the slower one at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    mon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
