"""Which launcher started this process, and so which rank it is: from the environment only.

Each launcher tells its processes who they are in its own variables; without
reading them, ``srun python`` and ``mpirun`` jobs would be N processes that all
claim "rank 0 of 1". Checked in this order, the first that matches wins:

  torchrun (and ``python -m torch.distributed.run``, accelerate, deepspeed: RANK / WORLD_SIZE)
  Open MPI  OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _SIZE
  PMI       PMI_RANK / PMI_SIZE, local rank from MPI_LOCALRANKID or PMI_LOCAL_RANK (MPICH, Intel MPI)
  Slurm     SLURM_PROCID / SLURM_LOCALID / SLURM_STEP_NUM_TASKS (else SLURM_NTASKS)

torchrun first: under ``srun torchrun`` the Slurm variables describe the
launcher (one per node), RANK the worker. MPI before Slurm for the same reason
(``mpirun`` inside an allocation inherits the batch script's SLURM_PROCID=0).
Slurm counts only inside a job step (SLURM_STEP_ID set): the batch script itself
has SLURM_PROCID=0 and SLURM_NTASKS=N but is one process, not rank 0 of N.

The job id: what every rank of one job agrees on and no other job has.
torchrun's run id when it is a real one; its default ``none`` (multi-node
torchrun without ``--rdzv-id``) is shared by every such job, so it is never used
as is (``job_id`` returns None and the hook asks the job's rendezvous store,
``watchdog.hook.lifecycle.jobid``). A Slurm step is ``slurm-<job>.<step>`` (also for
torchrun inside srun, before any store is asked); an MPI job its PMIx namespace
or Open MPI job id. Pure: a function of the mapping it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TORCHRUN_DEFAULT_RUN_ID = "none"  # torchrun --rdzv-id's default: every such job has it
# Every variable read here (test helpers clear them: a test run inside srun is not rank N of a job)
VARS = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_ess_base_jobid",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "PMIX_NAMESPACE",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEPID",
    "SLURM_JOB_ID", "SLURM_JOBID",
)  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """What the environment says about this process. Each value is (text, the
    variable it came from), so a bad one is reported by name."""

    launcher: str  # "torchrun", "openmpi", "pmi", "slurm"; "" when none matched
    rank: tuple[str, str] | None = None
    local_rank: tuple[str, str] | None = None
    world_size: tuple[str, str] | None = None


NONE = Launch("")


def _get(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(value, name) of the first variable of ``names`` set to something non-empty."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value, name
    return None


def detect(env: Mapping[str, str]) -> Launch:
    if _get(env, "RANK") and _get(env, "WORLD_SIZE"):
        return Launch("torchrun", _get(env, "RANK"), _get(env, "LOCAL_RANK"), _get(env, "WORLD_SIZE"))
    if _get(env, "OMPI_COMM_WORLD_RANK") and _get(env, "OMPI_COMM_WORLD_SIZE"):
        return Launch(
            "openmpi",
            _get(env, "OMPI_COMM_WORLD_RANK"),
            _get(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _get(env, "OMPI_COMM_WORLD_SIZE"),
        )
    if _get(env, "PMI_RANK") and _get(env, "PMI_SIZE"):
        return Launch(
            "pmi", _get(env, "PMI_RANK"), _get(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK"), _get(env, "PMI_SIZE")
        )
    if _get(env, "SLURM_PROCID") and _get(env, "SLURM_STEP_ID", "SLURM_STEPID"):
        world = _get(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        if world:
            return Launch("slurm", _get(env, "SLURM_PROCID"), _get(env, "SLURM_LOCALID"), world)
    return NONE


def job_id(env: Mapping[str, str]) -> str | None:
    """A job id all ranks of this job share and no other job has, from the
    environment alone; None when the environment has none (the caller asks the
    rendezvous store, or falls back to the default name)."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != TORCHRUN_DEFAULT_RUN_ID:
        return run_id
    slurm_job = _get(env, "SLURM_JOB_ID", "SLURM_JOBID")
    slurm_step = _get(env, "SLURM_STEP_ID", "SLURM_STEPID")
    if slurm_job and slurm_step:
        return f"slurm-{slurm_job[0]}.{slurm_step[0]}"
    mpi = _get(env, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
    if mpi and detect(env).launcher in ("openmpi", "pmi"):
        return f"mpi-{mpi[0]}"
    return None


def needs_agreement(env: Mapping[str, str]) -> bool:
    """torchrun with the default run id and no better id in the environment: the
    ranks must agree on one through their rendezvous store."""
    return env.get("TORCHELASTIC_RUN_ID", "").strip() == TORCHRUN_DEFAULT_RUN_ID and job_id(env) is None
