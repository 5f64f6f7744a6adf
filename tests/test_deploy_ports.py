"""Default ports: the agent and coordinator must bind next to the exporters a GPU node
already runs. 9400 is dcgm-exporter's default (and 9100-9999 is Prometheus' exhausted
range of exporter allocations), so every GPU node running dcgm-exporter refused our
agent. The pair is 19400 (agent) / 19401 (coordinator); every deploy file, doc and
example must agree with the flag defaults."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from watchdog.agent import config as agent_config
from watchdog.coordinator import config as coord_config
from watchdog.coordinator.cli import status as status_cli

REPO = Path(__file__).resolve().parents[1]
AGENT_PORT, COORD_PORT = 19400, 19401
# Defaults of exporters that run on the same GPU/training nodes, and torchrun's own ports.
TAKEN = {
    9100: "node_exporter",
    9400: "dcgm-exporter",
    9401: "dcgm-exporter (commonly the second instance)",
    9835: "nvidia_gpu_exporter",
    29400: "torchrun c10d rendezvous",
    29500: "torchrun MASTER_PORT",
}


def _flag_default(flags, name: str) -> str:
    (flag,) = [f for f in flags if f.name == name]
    return str(flag.default)


def test_flag_defaults_are_the_pair():
    assert _flag_default(agent_config.FLAGS, "web.listen-address").endswith(f":{AGENT_PORT}")
    assert _flag_default(coord_config.FLAGS, "web.listen-address").endswith(f":{COORD_PORT}")
    assert coord_config.Config().listen[1] == COORD_PORT
    assert _flag_default(status_cli.FLAGS, "coordinator.url").endswith(f":{COORD_PORT}")
    assert not {AGENT_PORT, COORD_PORT} & set(TAKEN)


def _tracked_text_files() -> list[Path]:
    """What users read and run; unit tests may use any number as an example address."""
    where = ["deploy", "docs", "README.md", "watchdog", "examples", "grafana", "tests/fixtures"]
    out = subprocess.run(["git", "ls-files", *where], cwd=REPO, capture_output=True, text=True, check=True).stdout
    skip = (".png", ".json")  # images; dashboards carry no ports
    return [REPO / p for p in out.split() if not p.endswith(skip) and (REPO / p).is_file()]


def test_no_file_uses_the_old_ports():
    """The old defaults collide with dcgm-exporter: no deploy file, doc or test may still use them."""
    old = re.compile(r"(?<![0-9])940[01](?![0-9])")
    hits = []
    for path in _tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        # A line that names dcgm-exporter is the docs explaining the choice, not a use.
        hits += [
            f"{path.relative_to(REPO)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if old.search(line) and "dcgm" not in line
        ]
    assert not hits, f"dcgm-exporter's port 9400/9401 still used: {hits}"


def test_deploy_files_use_the_defaults():
    uses = {
        p.relative_to(REPO).as_posix(): p.read_text()
        for p in _tracked_text_files()
        if p.is_relative_to(REPO / "deploy")
    }
    assert f":{AGENT_PORT}" in uses["deploy/systemd/agent.env"]
    assert f":{COORD_PORT}" in uses["deploy/systemd/coordinator.env"]
    # On Slurm nodes shared by jobs a fixed port would collide: the sbatch binds port 0
    # and hands Prometheus the ports bound (tests/test_deploy_slurm.py).
    assert "AGENT_PORT:-0}" in uses["deploy/slurm/train.sbatch"]
    assert "COORD_PORT:-0}" in uses["deploy/slurm/train.sbatch"]
    assert f"containerPort: {AGENT_PORT}" in uses["deploy/kubernetes/overlays/pytorchjob-sidecar/pytorchjob.yaml"]
    assert f"containerPort: {AGENT_PORT}" in uses["deploy/kubernetes/node-agent/daemonset.yaml"]
    assert f"containerPort: {COORD_PORT}" in uses["deploy/kubernetes/base/coordinator.yaml"]
