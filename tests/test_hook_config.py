"""install()'s configuration: precedence, validation, the disabled no-op."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from watchdog import rundir
from watchdog.contracts import slot as wire
from watchdog.hook import HookConfig, NullMonitor, current, install
from watchdog.hook.config import load_config
from watchdog.hook.testing import ENV_VARS, installed, read_monitor

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS + ("XDG_RUNTIME_DIR",):
        monkeypatch.delenv(var, raising=False)


def test_defaults_are_a_single_process():
    cfg = load_config({}, {})
    assert (cfg.rank, cfg.local_rank, cfg.world_size) == (0, 0, 1)
    assert cfg.enabled and cfg.patch_collectives and not cfg.auto_step
    assert cfg.job == "default"
    assert cfg.run_dir == rundir.default_run_dir({})  # /run/rank-watchdog where usable (test_rundir.py)
    assert cfg.host == socket.gethostname()
    assert cfg.ring_capacity == wire.DEFAULT_RING_CAPACITY
    assert cfg.heartbeat_interval_s == 0.5
    assert cfg.slot_run_id == ":0"


def test_torchrun_environment_is_read():
    env = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "TORCHELASTIC_RUN_ID": "abc123",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "XDG_RUNTIME_DIR": "/run/user/7",
        "WATCHDOG_RUN_DIR": "/run/user/7/rank-watchdog",
        "WATCHDOG_HOST_NAME": "node-a",
        "WATCHDOG_RING_CAPACITY": "32",
        "WATCHDOG_HEARTBEAT_INTERVAL_S": "0.25",
        "WATCHDOG_AUTO_STEP": "true",
        "WATCHDOG_PATCH_COLLECTIVES": "0",
    }
    cfg = load_config(env, {})
    assert (cfg.rank, cfg.local_rank, cfg.world_size, cfg.restart_count) == (3, 1, 8, 2)
    assert cfg.job == "abc123"  # the run id names the job unless WATCHDOG_JOB_NAME does
    assert cfg.slot_run_id == "abc123:2"
    assert cfg.run_dir == "/run/user/7/rank-watchdog"
    assert cfg.host == "node-a"
    assert (cfg.ring_capacity, cfg.heartbeat_interval_s) == (32, 0.25)
    assert cfg.auto_step is True and cfg.patch_collectives is False
    assert load_config({**env, "WATCHDOG_JOB_NAME": "named"}, {}).job == "named"


def test_deprecated_job_and_host_variables_still_work_with_one_warning_each(caplog):
    env = {"WATCHDOG_JOB": "old-job", "WATCHDOG_HOST": "old-host"}
    with caplog.at_level("WARNING", logger="watchdog.hook"):
        cfg = load_config(env, {})
    assert (cfg.job, cfg.host) == ("old-job", "old-host")
    warnings = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(warnings) == 2
    assert any("WATCHDOG_JOB is deprecated: set WATCHDOG_JOB_NAME" in w for w in warnings)
    assert any("WATCHDOG_HOST is deprecated: set WATCHDOG_HOST_NAME" in w for w in warnings)


def test_new_job_name_wins_over_the_deprecated_one_and_the_warning_says_so(caplog):
    env = {"WATCHDOG_JOB": "old", "WATCHDOG_JOB_NAME": "new"}
    with caplog.at_level("WARNING", logger="watchdog.hook"):
        assert load_config(env, {}).job == "new"
    assert any(
        "WATCHDOG_JOB is deprecated and ignored: WATCHDOG_JOB_NAME is set" in r.getMessage() for r in caplog.records
    )


def test_current_names_give_no_warning(caplog):
    with caplog.at_level("WARNING", logger="watchdog.hook"):
        load_config({"WATCHDOG_JOB_NAME": "j", "WATCHDOG_HOST_NAME": "h", "WATCHDOG_RUN_DIR": "/x"}, {})
    assert not caplog.records


def test_overrides_beat_environment_and_empty_env_is_unset():
    env = {"RANK": "1", "WORLD_SIZE": "2", "WATCHDOG_JOB_NAME": "", "WATCHDOG_RUN_DIR": "/from/env"}
    cfg = load_config(env, {"rank": 0, "run_dir": "/from/kw", "ring_capacity": "16"})
    assert cfg.rank == 0 and cfg.world_size == 2
    assert cfg.run_dir == "/from/kw" and cfg.job == "default" and cfg.ring_capacity == 16


def test_config_is_frozen():
    cfg = load_config({}, {})
    with pytest.raises(AttributeError):
        cfg.rank = 2  # type: ignore[misc]
    assert isinstance(cfg, HookConfig)


@pytest.mark.parametrize(
    "env, overrides, names",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, {}, "RANK"),
        ({"RANK": "-1"}, {}, "RANK"),
        ({"RANK": "one"}, {}, "RANK"),
        ({"WORLD_SIZE": "0"}, {}, "WORLD_SIZE"),
        ({"LOCAL_RANK": "-3"}, {}, "LOCAL_RANK"),
        ({"TORCHELASTIC_RESTART_COUNT": "-1"}, {}, "TORCHELASTIC_RESTART_COUNT"),
        ({"WATCHDOG_ENABLED": "yes"}, {}, "WATCHDOG_ENABLED"),
        ({"WATCHDOG_AUTO_STEP": "2"}, {}, "WATCHDOG_AUTO_STEP"),
        ({"WATCHDOG_PATCH_COLLECTIVES": "maybe"}, {}, "WATCHDOG_PATCH_COLLECTIVES"),
        ({"WATCHDOG_RING_CAPACITY": "0"}, {}, "WATCHDOG_RING_CAPACITY"),
        ({"WATCHDOG_RING_CAPACITY": str(wire.MAX_RING_CAPACITY + 1)}, {}, "WATCHDOG_RING_CAPACITY"),
        ({"WATCHDOG_RING_CAPACITY": "1.5"}, {}, "WATCHDOG_RING_CAPACITY"),
        ({"WATCHDOG_HEARTBEAT_INTERVAL_S": "0"}, {}, "WATCHDOG_HEARTBEAT_INTERVAL_S"),
        ({"WATCHDOG_HEARTBEAT_INTERVAL_S": "nan"}, {}, "WATCHDOG_HEARTBEAT_INTERVAL_S"),
        ({"WATCHDOG_HEARTBEAT_INTERVAL_S": "fast"}, {}, "WATCHDOG_HEARTBEAT_INTERVAL_S"),
        ({}, {"job": "   "}, "install(job=...)"),
        ({}, {"rank": 5}, "install(rank=...)"),
        ({}, {"rank": True}, "install(rank=...)"),
        ({}, {"heartbeat_interval_s": -1}, "install(heartbeat_interval_s=...)"),
        ({}, {"max_errors": 0}, "install(max_errors=...)"),
        ({}, {"job": 7}, "install(job=...)"),
        ({}, {"rankk": 1}, "rankk"),
    ],
)
def test_bad_values_raise_valueerror_naming_the_variable(env, overrides, names):
    with pytest.raises(ValueError, match=re.escape(names)):
        load_config(env, overrides)


def test_install_rejects_bad_env_loudly(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK"):
        install(run_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing created on the way to the error
    assert isinstance(current(), NullMonitor)


@pytest.mark.parametrize("how", ["env", "kw"])
def test_disabled_returns_the_noop_monitor_and_touches_nothing(monkeypatch, tmp_path, how):
    if how == "env":
        monkeypatch.setenv("WATCHDOG_ENABLED", "0")
        monkeypatch.setenv("RANK", "99")  # would be invalid: a disabled hook does not even parse it
        mon = install(run_dir=str(tmp_path))
    else:
        mon = install(enabled=False, run_dir=str(tmp_path))
    assert isinstance(mon, NullMonitor) and not mon.enabled
    assert not list(tmp_path.iterdir())
    data = [1, 2, 3]
    assert mon.wrap_loader(data) is data
    assert mon.phase("checkpoint") is mon.step_scope() is mon.phase("eval") is mon.collective("x")
    with mon.step_scope(), mon.phase("eval"), mon.collective("all_reduce"):
        mon.step()
    mon.watch_ddp(object())  # no-op, whatever it is given
    mon.register_checkpoint(print)
    mon.set_step(4)
    mon.close()
    assert mon.errors == 0 and mon.slot_path is None


def test_noop_monitor_costs_about_nothing():
    """The disabled step is an empty method call: compare it with one."""
    import timeit

    class Empty:
        def step(self):
            pass

    mon, ref = install(enabled=False), Empty()
    n = 20000
    t_mon = min(timeit.repeat(mon.step, number=n, repeat=5))
    t_ref = min(timeit.repeat(ref.step, number=n, repeat=5))
    assert t_mon < 3 * t_ref + 1e-3


def test_unknown_install_argument_is_a_valueerror(tmp_path):
    with pytest.raises(ValueError, match="unknown setting"):
        install(run_dir=str(tmp_path), ring_capacty=8)
    with pytest.raises(ValueError, match="clock"):
        install(run_dir=str(tmp_path), clock=5)  # type: ignore[arg-type]  # the misuse under test


def test_second_install_while_open_is_refused(tmp_path):
    with installed(tmp_path, patch_collectives=False) as mon:
        assert current() is mon
        with pytest.raises(ValueError, match="already installed"):
            install(run_dir=str(tmp_path))
    assert isinstance(current(), NullMonitor)
    with installed(tmp_path, patch_collectives=False) as again:  # after close() it is allowed
        assert again.enabled


def test_identity_in_the_slot(monkeypatch, tmp_path):
    import psutil

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    with installed(tmp_path, patch_collectives=False, host="hostA") as mon:
        path = mon.slot_path
        assert path == str(tmp_path / wire.slot_filename("run7", 1, os.getpid()))
        assert os.stat(path).st_mode & 0o777 == 0o644
        h = read_monitor(mon).header
        ident = h.identity
        assert (ident.job, ident.host, ident.run_id) == ("run7", "hostA", "run7:3")
        assert (ident.rank, ident.local_rank, ident.world_size, ident.pid) == (1, 1, 4, os.getpid())
        assert ident.proc_start_us == round(psutil.Process().create_time() * 1e6)
        # and the part of it no step of the wall clock moves: the start in ticks after boot
        with open(f"/proc/{os.getpid()}/stat") as fh:  # field 22, after the command name's last ')'
            assert ident.proc_start_ticks == int(fh.read().rsplit(")", 1)[1].split()[19])
        assert h.status == wire.Status.RUNNING
    assert wire.read_slot(path).header.status == wire.Status.EXITED  # the file stays for a post-mortem


def test_hook_imports_and_runs_without_torch(tmp_path):
    """The agent's environment has no torch: importing and installing must work,
    auto_step (which needs torch) must fail loudly."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        import watchdog.hook
        from watchdog.hook.testing import read_monitor
        mon = watchdog.hook.install(run_dir={str(tmp_path)!r})
        for _ in mon.wrap_loader(range(3)):
            mon.step()
        with mon.phase("eval"), mon.collective("all_reduce", nbytes=8):
            pass
        assert read_monitor(mon).header[watchdog.contracts.slot.H_STEP] == 3
        assert mon.errors == 0, mon.errors
        mon.close()
        try:
            watchdog.hook.install(run_dir={str(tmp_path)!r}, auto_step=True)
        except ValueError as e:
            assert "torch" in str(e)
            print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_system_run_dir_this_user_cannot_write_is_named_in_a_warning(monkeypatch, tmp_path, caplog):
    shared = tmp_path / "run-rank-watchdog"
    shared.mkdir()
    monkeypatch.setattr(rundir, "SYSTEM_RUN_DIR", str(shared))
    monkeypatch.setattr(rundir, "usable", lambda _path: False)  # as for a user outside group rank-watchdog
    with caplog.at_level("WARNING", logger="watchdog.hook"):
        cfg = load_config({}, {})
    assert cfg.run_dir == f"/tmp/rank-watchdog-{os.getuid()}"
    (msg,) = [r.getMessage() for r in caplog.records]
    assert str(shared) in msg and "WATCHDOG_RUN_DIR" in msg and "will not see this rank" in msg
    monkeypatch.setattr(rundir, "usable", lambda _path: True)
    caplog.clear()
    with caplog.at_level("WARNING", logger="watchdog.hook"):
        assert load_config({}, {}).run_dir == str(shared)
    assert not caplog.records
