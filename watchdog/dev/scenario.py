"""Run one fault scenario through ``watchdog demo --json`` and collect what happened.

Shared by the end-to-end tests and ``benchmarks/detection.py``: both need the
findings the coordinator journaled, the true onset of the injected fault (the
example prints a ``WATCHDOG_FAULT {json}`` line at the moment it injects), and
the demo's summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.coordinator.journal import event_names as je
from watchdog.dev.demo import ACTION_EVENTS, SUMMARY

FAULT_MARK = "WATCHDOG_FAULT "


@dataclass
class ScenarioResult:
    findings: list[dict]  # {"kind", "ranks", "t", "reason", "onset_t"?} in journal order
    summary: dict
    faults: list[dict] = field(default_factory=list)  # {"kind", "rank", "step", "t_wall"} as injected
    output: str = ""
    # action / action_progress / action_outcome / restart / resumed / state lines, in journal order
    actions: list[dict] = field(default_factory=list)

    def events(self, name: str) -> list[dict]:
        return [a for a in self.actions if a["event"] == name]

    @property
    def work_dir(self) -> Path:
        return Path(self.summary.get("work_dir", "."))

    def first(self, kind: str | None = None) -> dict | None:
        return next((f for f in self.findings if kind is None or f["kind"] == kind), None)

    def latency_s(self, finding: dict) -> float | None:
        """Seconds from the first injected fault to this finding's detection."""
        if not self.faults:
            return None
        t0_wall = self.summary["t0_wall"]
        return round(finding["t"] - (min(f["t_wall"] for f in self.faults) - t0_wall), 3)


def _fault_marks(log_path: Path) -> list[dict]:
    marks: list[dict] = []
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return marks
    for line in text.splitlines():
        idx = line.find(FAULT_MARK)
        if idx >= 0:
            try:
                marks.append(json.loads(line[idx + len(FAULT_MARK) :]))
            except ValueError:
                continue
    return marks


def run(
    faults: Sequence[str] = (),
    *,
    ranks: int = 4,
    steps: int = 100,
    compute_ms: float = 50.0,
    linger_s: float = 3.0,
    timeout_s: float = 180.0,
    script_args: Sequence[str] = (),
    env: dict | None = None,
    work_dir: str | None = None,
    action: str | None = None,
    policy: str | None = None,
    max_restarts: int = 3,
    watchdog: Sequence[str] = (sys.executable, "-m", "watchdog.cli"),
    cwd: str | None = None,
) -> ScenarioResult:
    """``action`` / ``policy``: run with a coordinator policy (``watchdog demo
    --action`` / ``--policy``): torchrun gets --max-restarts and the example
    checkpoints unless ``script_args`` says where. ``watchdog``: the command that
    runs the CLI (another environment's ``watchdog`` console script, say)."""
    work_dir = work_dir or tempfile.mkdtemp(prefix="watchdog-scenario-")
    argv = [
        *watchdog,
        "demo",
        "--json",
        "--ranks",
        str(ranks),
        "--steps",
        str(steps),
        "--compute-ms",
        str(compute_ms),
        "--linger-seconds",
        str(linger_s),
        "--timeout-seconds",
        str(timeout_s),
        "--work-dir",
        work_dir,
        *[f"--fault={f}" for f in faults],
    ]
    if action:
        argv += ["--action", action, "--max-restarts", str(max_restarts)]
    if policy:
        argv += ["--policy", policy, "--max-restarts", str(max_restarts)]
    if script_args:
        argv += ["--", *script_args]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s + 120, env={**os.environ, **(env or {})}, cwd=cwd
    )
    findings, summary, actions = [], {}, []
    for line in proc.stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("event") == je.FINDING:
            findings.append(obj)
        elif obj.get("event") == SUMMARY:
            summary = obj
        elif obj.get("event") in ACTION_EVENTS:
            actions.append(obj)
    if proc.returncode != 0 or not summary:
        raise RuntimeError(f"demo failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = ScenarioResult(findings=findings, summary=summary, output=proc.stdout, actions=actions)
    result.faults = _fault_marks(result.work_dir / "torchrun.log")
    return result
