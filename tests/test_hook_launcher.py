"""Launcher detection: srun and mpirun ranks are not all "rank 0 of 1", and a
job id is never shared by accident (torchrun's default run id ``none``)."""

from __future__ import annotations

import pytest

from watchdog.hook.config import load_config
from watchdog.hook.lifecycle import launcher

TORCHRUN = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "abc", "WATCHDOG_RUN_DIR": "/x"}
SLURM_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NTASKS": "16",  # the allocation's
    "SLURM_STEP_NUM_TASKS": "8",  # this srun's: what the ranks are
    "WATCHDOG_RUN_DIR": "/x",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "4",
    "PMIX_NAMESPACE": "prterun-host-1234@1",
    "WATCHDOG_RUN_DIR": "/x",
}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "WATCHDOG_RUN_DIR": "/x"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (TORCHRUN, ("torchrun", 5, 1, 8, "abc")),
        (SLURM_STEP, ("slurm", 6, 2, 8, "slurm-4242.0")),
        (OPENMPI, ("openmpi", 3, 1, 4, "mpi-prterun-host-1234@1")),
        (MPICH, ("pmi", 2, 0, 3, "default")),
        # srun torchrun: torchrun's RANK is the worker's, Slurm's the per-node launcher's
        ({**SLURM_STEP, **TORCHRUN}, ("torchrun", 5, 1, 8, "abc")),
        # mpirun inside an allocation inherits the batch script's SLURM_PROCID=0
        ({**{k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_ID"}, **OPENMPI}, ("openmpi", 3, 1, 4, None)),
        # the batch script itself: one process, not rank 0 of SLURM_NTASKS
        ({k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_ID"}, ("", 0, 0, 1, "default")),
        ({"WATCHDOG_RUN_DIR": "/x"}, ("", 0, 0, 1, "default")),
    ],
)
def test_each_launcher_names_the_rank_and_the_job(env, expected):
    name, rank, local_rank, world, job = expected
    cfg = load_config(env)
    assert launcher.detect(env).launcher == name
    assert (cfg.rank, cfg.local_rank, cfg.world_size) == (rank, local_rank, world)
    if job is not None:
        assert cfg.job == job


def test_a_bad_launcher_value_names_its_variable():
    with pytest.raises(ValueError, match=r"SLURM_PROCID=9: rank must be in 0\.\.7"):
        load_config({**SLURM_STEP, "SLURM_PROCID": "9"})
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_SIZE='x'"):
        load_config({**OPENMPI, "OMPI_COMM_WORLD_SIZE": "x"})


def test_explicit_settings_beat_the_launcher():
    cfg = load_config({**SLURM_STEP, "WATCHDOG_JOB_NAME": "mine"}, {"rank": 1})
    assert (cfg.rank, cfg.world_size, cfg.job) == (1, 8, "mine")


NONE_RUN = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}


def test_torchruns_default_run_id_is_never_the_job_name():
    asked = []

    def agree(env):
        asked.append(env["TORCHELASTIC_RUN_ID"])
        return "torchrun-0123abcd"

    assert load_config(NONE_RUN, agree=agree).job == "torchrun-0123abcd"
    assert asked == ["none"]
    # nobody to agree with: the default name, never "none"
    assert load_config(NONE_RUN, agree=lambda env: None).job == "default"
    assert load_config(NONE_RUN).job == "default"


def test_the_store_is_asked_only_when_nothing_else_names_the_job():
    def agree(env):
        raise AssertionError("asked")

    assert load_config(TORCHRUN, agree=agree).job == "abc"
    assert load_config({**NONE_RUN, "WATCHDOG_JOB_NAME": "named"}, agree=agree).job == "named"
    # srun torchrun without --rdzv-id: the Slurm step names the job, no store round trip
    assert load_config({**SLURM_STEP, **NONE_RUN}, agree=agree).job == "slurm-4242.0"


def test_ranks_of_one_job_agree_through_the_store_and_two_jobs_do_not():
    torch = pytest.importorskip("torch.distributed")
    from watchdog.hook.lifecycle import jobid

    ids = []
    for _job in range(2):
        server = torch.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        env = {**NONE_RUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1"}
        env["MASTER_PORT"] = str(server.port)
        ranks = {jobid.agree(env) for _rank in range(3)}  # each rank proposes its own
        assert len(ranks) == 1 and str(next(iter(ranks))).startswith("torchrun-")
        ids.append(ranks.pop())
        del server
    assert ids[0] != ids[1]


def test_no_agent_store_means_no_agreement_and_no_error():
    from watchdog.hook.lifecycle import jobid

    assert jobid.agree(NONE_RUN) is None
    env = {**NONE_RUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    assert jobid.agree(env, timeout_s=0.5) is None
