"""A plain ``init_process_group("gloo")`` made restart-safe under torchrun.

Under torchrun the workers rendezvous on the elastic agent's store
(TORCHELASTIC_USE_AGENT_STORE=True), which outlives them: after a restart the new
workers read the peer addresses the previous attempt left under ``default_pg/``
and gloo fails with "connectFullMesh ... Connection refused" (pytorch#167288,
NCCL alike); torchrun spends its restarts and the group ends stuck in
init_process_group. Scoping the group's keys to the attempt
(``PrefixStore("watchdog/attempt<TORCHELASTIC_RESTART_COUNT>", store)``) fixes it:
each attempt starts from empty keys on the same store, and every rank of one
node has the same restart count. Not every node: with the c10d rendezvous, a node
restarted for a membership change (another node re-joined after its failure) does
not count it, so multi-node jobs that restart run with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per attempt, no agent store:
nothing here applies; README).

``plan`` and ``rendezvous`` turn the user's arguments into that call: torch's own env://
rendezvous (the same store, rank and world size init_process_group would get),
wrapped in the prefix, passed as ``store=``. It applies only to the one case that
breaks: default init (no store, env:// or no init_method) on the agent's store,
and not MPI (its runtime places the ranks). Anything else returns None and the
call goes through unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

PREFIX = "watchdog/attempt"
PREFIX_ARG = "_watchdog_prefix"  # where plan() leaves the prefix for rendezvous()


def attempt_prefix(env: Mapping[str, str]) -> str | None:
    """The store prefix for this attempt, or None when the agent's store is not
    shared across attempts (then the group's keys are fresh anyway)."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "") != "True":
        return None
    count = env.get("TORCHELASTIC_RESTART_COUNT", "").strip()
    return f"{PREFIX}{count}" if count.isdigit() else None


def plan(orig: Callable, args: tuple, kwargs: dict, env: Mapping[str, str]) -> dict | None:
    """The arguments of this init_process_group call by name, with the attempt's
    prefix under ``PREFIX_ARG``, when it must be scoped; None to call it as given.
    Pure: decides only (a bad call fails here as the hook's own error)."""
    prefix = attempt_prefix(env)
    if prefix is None:
        return None
    a = dict(inspect.signature(orig).bind(*args, **kwargs).arguments)
    if a.get("store") is not None or a.get("init_method") not in (None, "env://"):
        return None
    if str(a.get("backend") or "").lower() in ("mpi", "fake"):
        return None
    a[PREFIX_ARG] = prefix
    return a


def rendezvous(planned: dict) -> dict:
    """Keyword arguments for init_process_group on the attempt-scoped store:
    torch's own env:// rendezvous, as init_process_group would run it. What it
    raises (a missing MASTER_ADDR, a timeout) is what the user's call would."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    a = dict(planned)
    prefix = a.pop(PREFIX_ARG)
    a.pop("init_method", None)
    timeout = a.get("timeout")
    if timeout is None:
        timeout = c10d._get_default_timeout(  # noqa: SLF001 - torch's default, as init_process_group reads it
            dist.Backend(a.get("backend") or "undefined")
        )
    store, rank, world_size = next(
        dist.rendezvous("env://", a.get("rank", -1), a.get("world_size", -1), timeout=timeout)
    )
    store.set_timeout(timeout)
    a.update(store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size, timeout=timeout)
    return a
