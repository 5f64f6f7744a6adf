"""Restart-safe default init: which init_process_group calls are scoped to the
restart attempt, and that the scoped call really initialises a group on the
agent's store under the attempt's prefix (a 1-rank gloo group, in process)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from watchdog.hook.zero_code import initstore

dist = pytest.importorskip("torch.distributed")
INIT = dist.distributed_c10d.init_process_group
AGENT = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}


@pytest.mark.parametrize(
    ("env", "args", "kwargs", "prefix"),
    [
        (AGENT, ("gloo",), {}, "watchdog/attempt2"),
        (AGENT, (), {"backend": "gloo", "init_method": "env://"}, "watchdog/attempt2"),
        (AGENT, (), {}, "watchdog/attempt2"),  # backend left to torch
        # the store is fresh per attempt anyway (rank 0 hosts it): nothing to do
        ({**AGENT, "TORCHELASTIC_USE_AGENT_STORE": "False"}, ("gloo",), {}, None),
        ({"TORCHELASTIC_USE_AGENT_STORE": "True"}, ("gloo",), {}, None),  # not torchrun's worker
        (AGENT, ("gloo",), {"store": object(), "rank": 0, "world_size": 1}, None),  # the user's own store wins
        (AGENT, ("gloo", "tcp://10.0.0.1:23456"), {}, None),
        (AGENT, ("gloo", "file:///tmp/x"), {}, None),
        (AGENT, ("mpi",), {}, None),
    ],
)
def test_only_a_default_init_on_the_agents_store_is_scoped(env, args, kwargs, prefix):
    planned = initstore.plan(INIT, args, kwargs, env)
    assert (planned or {}).get(initstore.PREFIX_ARG) == prefix


def test_a_call_init_process_group_would_reject_is_rejected_by_the_plan_too():
    with pytest.raises(TypeError):
        initstore.plan(INIT, ("gloo",), {"no_such_argument": 1}, AGENT)


def test_the_scoped_call_joins_a_real_group_on_the_agents_store_under_the_attempts_prefix(monkeypatch):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    server.set_timeout(timedelta(seconds=5))  # a get of a missing key fails instead of hanging the test
    server.set("default_pg/0", "a stale address from the previous attempt")
    for k, v in {**AGENT, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("WORLD_SIZE", "1")
    planned = initstore.plan(INIT, ("gloo",), {"timeout": timedelta(seconds=20)}, os.environ)
    assert planned is not None
    kwargs = initstore.rendezvous(planned)
    assert (kwargs["rank"], kwargs["world_size"], kwargs["backend"]) == (0, 1, "gloo")
    INIT(**kwargs)
    try:
        dist.barrier()
        dist.distributed_c10d._get_default_store().set("probe", "x")
        # every key the group wrote is under the attempt's prefix; the stale one is untouched
        keys = set(server.list_keys())
        assert "default_pg/0" in keys and len(keys) > 1, keys
        assert all(k.startswith("watchdog/attempt2/") for k in keys - {"default_pg/0"}), keys
        assert any(k.endswith("/probe") for k in keys), keys
        assert server.get("default_pg/0") == b"a stale address from the previous attempt"
    finally:
        dist.destroy_process_group()


def _agent_store(monkeypatch, server):
    for k, v in {**AGENT, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


@pytest.mark.parametrize("restart_safe", [True, False])
def test_install_makes_a_plain_init_restart_safe_unless_switched_off(tmp_path, monkeypatch, restart_safe):
    from watchdog.hook.testing import installed

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _agent_store(monkeypatch, server)
    monkeypatch.setenv("WATCHDOG_RESTART_SAFE_INIT", "1" if restart_safe else "0")
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        dist.init_process_group("gloo")  # the script's plain call, unchanged
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
        assert mon.errors == 0
    keys = server.list_keys()
    scoped = [k for k in keys if k.startswith("watchdog/attempt2/")]
    assert (len(scoped) == len(keys)) if restart_safe else not scoped, keys
