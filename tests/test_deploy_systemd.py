"""The systemd units (deploy/systemd/): `systemd-analyze verify` finds nothing to say,
the hardening stays where it is (offline `systemd-analyze security`), and the
example environment files load through the daemons' real flag parsers."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

from watchdog import flags
from watchdog.agent import config as agent_config
from watchdog.coordinator import config as coord_config

SYSTEMD = promcheck.REPO / "deploy" / "systemd"
UNITS = {"rank-watchdog-agent.service": 4.0, "rank-watchdog-coordinator@.service": 2.5}  # max exposure score
WATCHDOG = str(promcheck.REPO / ".venv" / "bin" / "watchdog")


def analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not available (Debian package systemd)")
    return path


def local_copy(name: str, tmp_path: Path) -> Path:
    """The unit with ExecStart pointed at this checkout's `watchdog` (verify checks
    that the binary exists) and a template unit instantiated."""
    text = (SYSTEMD / name).read_text()
    assert text.count("ExecStart=/usr/local/bin/watchdog ") == 1
    exe = WATCHDOG if Path(WATCHDOG).exists() else shutil.which("watchdog")
    assert exe, "the package's `watchdog` script is not installed"
    dst = tmp_path / name.replace("@.", "@job1.")
    dst.write_text(text.replace("ExecStart=/usr/local/bin/watchdog", f"ExecStart={exe}"))
    return dst


@pytest.mark.parametrize("name", UNITS)
def test_unit_verifies_cleanly(name: str, tmp_path: Path):
    res = promcheck.run([analyze(), "verify", str(local_copy(name, tmp_path))])
    # verify exits 0 on unknown keys and bad values, only warning: any output fails.
    assert res.returncode == 0 and not res.stderr.strip() and not res.stdout.strip(), res.stdout + res.stderr


def test_verify_can_fail(tmp_path: Path):
    unit = local_copy("rank-watchdog-agent.service", tmp_path)
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=sometimes"))
    res = promcheck.run([analyze(), "verify", str(unit)])
    assert "restart specifier" in res.stderr


@pytest.mark.parametrize("name,limit", UNITS.items())
def test_hardening_exposure(name: str, limit: float, tmp_path: Path):
    res = promcheck.run([analyze(), "security", "--offline=yes", "--no-pager", str(local_copy(name, tmp_path))])
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", res.stdout + res.stderr)
    assert m, res.stdout + res.stderr
    assert float(m.group(1)) <= limit, f"{name}: exposure {m.group(1)} > {limit}"


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def exec_args(unit: str, instance: str = "job1") -> list[str]:
    line = next(ln for ln in (SYSTEMD / unit).read_text().splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(line.partition("=")[2].replace("%i", instance))
    return argv[2:]  # after `watchdog <subcommand>`


def test_agent_env_file_loads(tmp_path: Path):
    env = env_file(SYSTEMD / "agent.env")
    assert set(env) <= {f.env for f in agent_config.FLAGS}, set(env) - {f.env for f in agent_config.FLAGS}
    token = tmp_path / "job.token"
    token.write_text("s3cret-of-32-bytes-s3cret-s3cret\n")
    env["WATCHDOG_JOB_TOKEN_FILE"] = str(token)
    cfg = agent_config.load(exec_args("rank-watchdog-agent.service"), env)
    assert (
        cfg.run_dir == "/run/rank-watchdog"
        and cfg.token == "s3cret-of-32-bytes-s3cret-s3cret"
        and not cfg.token_from_argv
    )
    assert cfg.listen == ("0.0.0.0", 19400)


def test_coordinator_env_file_loads(tmp_path: Path):
    env = env_file(SYSTEMD / "coordinator.env")
    assert set(env) <= {f.env for f in coord_config.FLAGS}, set(env) - {f.env for f in coord_config.FLAGS}
    token = tmp_path / "job.token"
    token.write_text("s3cret-of-32-bytes-s3cret-s3cret\n")
    env["WATCHDOG_JOB_TOKEN_FILE"] = str(token)
    values = flags.parse(
        "watchdog coordinator", "", coord_config.FLAGS, exec_args("rank-watchdog-coordinator@.service"), env
    )
    cfg = coord_config.from_values(values)
    assert cfg.job == "job1" and cfg.journal == "/var/lib/rank-watchdog/job1.jsonl"
    assert cfg.token == "s3cret-of-32-bytes-s3cret-s3cret" and cfg.world_size == 64


def test_no_token_on_a_command_line():
    for path in SYSTEMD.iterdir():
        text = path.read_text()
        assert not re.search(r"--job\.token(?!-file)|WATCHDOG_JOB_TOKEN=", text), path.name
