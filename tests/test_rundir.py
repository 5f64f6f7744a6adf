"""The default run directory: one rule for the hook and the agent, and one that
the shipped systemd agent (PrivateTmp=yes) can see."""

from __future__ import annotations

import os

from watchdog import rundir
from watchdog.agent import config as agent_config
from watchdog.hook.config import default_run_dir as hook_default


def test_system_run_dir_wins_when_usable():
    got = rundir.default_run_dir({"XDG_RUNTIME_DIR": "/run/user/7"}, uid=7, check=lambda p: p == "/run/rank-watchdog")
    assert got == "/run/rank-watchdog"


def test_without_it_the_per_user_fallbacks_apply():
    never = lambda _p: False  # noqa: E731
    assert rundir.default_run_dir({"XDG_RUNTIME_DIR": "/run/user/7"}, uid=7, check=never) == "/run/user/7/rank-watchdog"
    assert rundir.default_run_dir({}, uid=7, check=never) == "/tmp/rank-watchdog-7"


def test_usable_means_a_directory_this_user_can_create_files_in(tmp_path):
    assert rundir.usable(str(tmp_path))
    assert not rundir.usable(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("")
    assert not rundir.usable(str(tmp_path / "file"))
    assert not rundir.usable(str(tmp_path), access=lambda _p, _m: False)


def test_system_dir_in_the_hook_and_the_agent_is_the_shipped_units_dir():
    # deploy/systemd: tmpfiles creates it and the agent's env file reads it.
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[1] / "deploy" / "systemd"
    assert f"d {rundir.SYSTEM_RUN_DIR} " in (deploy / "rank-watchdog.tmpfiles.conf").read_text()
    assert f"RUN_DIR={rundir.SYSTEM_RUN_DIR}\n" in (deploy / "agent.env").read_text()
    unit = (deploy / "rank-watchdog-agent.service").read_text()
    assert "RuntimeDirectory=rank-watchdog\n" in unit and "RuntimeDirectoryPreserve=yes\n" in unit


def test_hook_and_agent_share_the_default(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    cfg = agent_config.load([], env)
    assert cfg.run_dir == hook_default(env) == rundir.default_run_dir(env)


def test_fallback_note_only_when_the_system_dir_exists_but_is_not_ours():
    exists = lambda p: p == "/run/rank-watchdog"  # noqa: E731
    assert rundir.fallback_note("/run/rank-watchdog", exists=exists) == ""
    assert rundir.fallback_note("/tmp/rank-watchdog-7", exists=lambda _p: False) == ""
    note = rundir.fallback_note("/tmp/rank-watchdog-7", exists=exists)
    assert "/run/rank-watchdog" in note and "WATCHDOG_RUN_DIR" in note and "rank-watchdog" in note


def test_uid_default_is_the_real_one():
    assert rundir.user_run_dir({}) == f"/tmp/rank-watchdog-{os.getuid()}"
