"""``watchdog doctor`` on a good host and a broken one: a real coordinator to
reach, a fixture /proc for the ptrace rights, a run dir owned by someone else."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from watchdog.dev import localjob
from watchdog.doctor import check, runner
from watchdog.doctor.nvml import Nvml
from watchdog.doctor.ptrace import CAP_SYS_PTRACE, Ptrace

TOKEN = "0123456789abcdef0123456789abcdef"


def fake_proc(root, *, scope: int | None, caps: int) -> str:
    (root / "self").mkdir(parents=True)
    (root / "self" / "status").write_text(f"Name:\tpython\nNSpid:\t4242\nCapEff:\t{caps:016x}\n")
    if scope is not None:
        (root / "sys" / "kernel" / "yama").mkdir(parents=True)
        (root / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{scope}\n")
    return str(root)


def doctor(*args: str) -> tuple[int, dict[str, dict]]:
    out = subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "doctor", "--json", "--role", "agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, {c["check"]: c for c in json.loads(out.stdout)["checks"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_good_host_then_broken_host(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    good_proc = fake_proc(tmp_path / "proc-good", scope=1, caps=1 << CAP_SYS_PTRACE)
    common = ["--job.token-file", str(token), "--agent.listen-address", f"127.0.0.1:{free_port()}"]
    coord = localjob.start_coordinator(tmp_path, "job", 2, tmp_path / "j.jsonl", ["--job.token-file", str(token)])
    try:
        rc, good = doctor(
            *common, "--run-dir", str(run_dir), "--path.procfs", good_proc, "--coordinator.url", coord.url
        )
        # The same coordinator, a token it does not know.
        wrong = tmp_path / "wrong"
        wrong.write_text("f" * 32)
        wrong.chmod(0o600)
        _, refused = doctor("--job.token-file", str(wrong), "--coordinator.url", coord.url, "--path.procfs", good_proc)
    finally:
        coord.stop()
    assert rc == 0, good
    for name in ("run_dir", "token_file", "ports", "ptrace", "py_spy", "pid_namespace", "coordinator"):
        assert good[name]["status"] == "ok", good[name]
    assert good["nvml"]["status"] in ("ok", "warn")
    assert refused["coordinator"]["status"] == "fix" and "401" in refused["coordinator"]["detail"]
    assert "same token" in refused["coordinator"]["fix"]

    # Broken: run dir owned by nobody, ptrace limited to descendants without the
    # capability, the coordinator gone.
    if os.geteuid() != 0:
        pytest.skip("giving the run dir to another user (65534) needs root")
    os.chown(run_dir, 65534, 65534)
    bad_proc = fake_proc(tmp_path / "proc-bad", scope=1, caps=0)
    rc, bad = doctor(
        *common,
        "--run-dir",
        str(run_dir),
        "--path.procfs",
        bad_proc,
        "--coordinator.url",
        f"http://127.0.0.1:{free_port()}",
    )
    assert rc == 1
    assert bad["run_dir"]["status"] == "fix" and "owned by uid" in bad["run_dir"]["detail"]
    assert bad["run_dir"]["fix"]
    assert bad["ptrace"]["status"] == "fix" and "ptrace_scope=1" in bad["ptrace"]["detail"]
    assert "CAP_SYS_PTRACE" in bad["ptrace"]["fix"]
    assert bad["coordinator"]["status"] == "fix" and "unreachable" in bad["coordinator"]["detail"]
    assert bad["token_file"]["status"] == "ok" and bad["py_spy"]["status"] == "ok"


@pytest.mark.parametrize(
    ("scope", "caps", "status"),
    [
        (None, 0, "warn"),  # no Yama: same-user ranks only
        (0, 0, "warn"),
        (1, 0, "fix"),
        (2, 0, "fix"),
        (1, 1 << CAP_SYS_PTRACE, "ok"),
        (2, 1 << CAP_SYS_PTRACE, "ok"),
        (3, 1 << CAP_SYS_PTRACE, "fix"),  # nobody, until reboot
    ],
)
def test_ptrace_rights_table(tmp_path, scope, caps, status):
    host = check.Host(proc_root=fake_proc(tmp_path, scope=scope, caps=caps))
    result = Ptrace().check(host)
    assert result.status == status, result
    assert bool(result.fix) == (status != "ok")


def test_token_file_readable_by_everyone_or_short_is_a_fix(tmp_path):
    f = tmp_path / "t"
    f.write_text(TOKEN)
    f.chmod(0o644)
    results = {r.name: r for r in runner.run(check.Host(roles=frozenset({"coordinator"}), token_file=str(f)))}
    assert results["token_file"].status == "fix" and "chmod 0600" in results["token_file"].fix
    f.chmod(0o600)
    f.write_text("short")
    results = {r.name: r for r in runner.run(check.Host(roles=frozenset({"coordinator"}), token_file=str(f)))}
    assert results["token_file"].status == "fix" and "bytes" in results["token_file"].detail


def test_port_in_use_is_a_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        host = check.Host(roles=frozenset({"coordinator"}), coordinator_listen=("127.0.0.1", port))
        result = next(r for r in runner.run(host) if r.name == "ports")
    assert result.status == "fix" and "in use" in result.detail


class _NoLibrary:
    def nvmlInit(self):
        raise OSError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        raise OSError("not started")


def test_nvml_missing_is_a_fix_only_where_there_are_gpus(tmp_path):
    assert Nvml(_NoLibrary()).check(check.Host(dev_root=str(tmp_path))).status == "warn"
    (tmp_path / "nvidia0").write_text("")
    assert Nvml(_NoLibrary()).check(check.Host(dev_root=str(tmp_path))).status == "fix"


def test_a_check_that_raises_is_reported_and_the_others_run():
    class Broken:
        name, roles = "broken", frozenset({"agent"})

        def check(self, host):
            raise RuntimeError("boom")

    results = runner.run(check.Host(roles=frozenset({"agent"})), (Broken(), Ptrace()))
    assert [r.name for r in results] == ["broken", "ptrace"]
    assert results[0].status == "fix" and "boom" in results[0].detail
    assert runner.exit_code(results) == 1


def test_a_journal_another_coordinator_holds_is_a_fix(tmp_path):
    from watchdog.coordinator.journal import lock as journallock

    host = check.Host(roles=frozenset({"coordinator"}), journal=str(tmp_path / "j.jsonl"))
    result = next(r for r in runner.run(host) if r.name == "journal")
    assert result.status == "ok", result
    fd = journallock.acquire(host.journal)
    try:
        result = next(r for r in runner.run(host) if r.name == "journal")
    finally:
        journallock.release(fd)
    assert result.status == "fix" and f"pid {os.getpid()}" in result.detail
    made = check.Host(roles=frozenset({"coordinator"}), journal=str(tmp_path / "new" / "j.jsonl"))
    assert next(r for r in runner.run(made) if r.name == "journal").status == "ok"  # the coordinator creates it
    if os.geteuid() != 0:  # root may write anywhere
        closed = tmp_path / "closed"
        closed.mkdir(mode=0o500)
        denied = check.Host(roles=frozenset({"coordinator"}), journal=str(closed / "j.jsonl"))
        assert next(r for r in runner.run(denied) if r.name == "journal").status == "fix"
