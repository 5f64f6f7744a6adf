"""The daemons' image (deploy/kubernetes/Dockerfile, .dockerignore), checked without a
Docker daemon (CI has none): its stages as Docker parses them, and its build stage
replayed on the context .dockerignore lets through, building the wheel the image
installs."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "kubernetes" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def test_multi_stage_non_root_and_installs_the_wheel_only():
    build, final = stages()
    assert re.fullmatch(r"python:\S+-slim AS build", build[0][1]), build[0]
    final_ops = dict(final)
    assert "COPY" not in final_ops and "ADD" not in final_ops, "nothing of the checkout in the image's layers"
    (run,) = [a for i, a in final if i == "RUN"]
    assert "--mount=type=bind,from=build" in run and ".whl)[all]" in run and "--no-cache-dir" in run
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) != 0
    assert final_ops["ENTRYPOINT"] == '["watchdog"]'
    # the syntax directive comes first, before any comment (BuildKit's --mount)
    assert DOCKERFILE.read_text().startswith("# syntax=docker/dockerfile:1\n")


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negate, pat = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
        if pat.startswith("**/"):  # at any depth: a path component
            hit = any(fnmatch.fnmatch(part, pat[3:]) for part in parts)
        else:  # from the context's root
            hit = any(fnmatch.fnmatch(p, pat) for p in prefixes)
        if hit:
            result = not negate
    return result


def context() -> list[str]:
    patterns = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [f for f in files if (REPO / f).is_file() and not ignored(f, patterns)]


def test_context_is_the_package_alone():
    sent = context()
    assert "pyproject.toml" in sent and "watchdog/cli.py" in sent
    assert not [f for f in sent if f.startswith((".git/", ".venv/", "tests/", "benchmarks/", "deploy/", "docs/"))]
    assert {f.split("/")[0] for f in sent} == {"pyproject.toml", "README.md", "LICENSE", "watchdog"}


@pytest.mark.integration
def test_build_stage_builds_the_wheel_from_that_context(tmp_path: Path):
    """The build stage's COPY and RUN replayed on exactly what the context holds."""
    (build, _final) = stages()
    src = tmp_path / "src"
    for ins, args in build:
        if ins == "COPY":
            *sources, dest = shlex.split(args)
            for s in sources:
                for f in context():
                    if f == s or f.startswith(s.rstrip("/") + "/"):
                        rel = f if dest.endswith("/") or dest == "./" else f.replace(s, dest.removeprefix("./"), 1)
                        target = src / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes((REPO / f).read_bytes())
    (run,) = [a for i, a in build if i == "RUN"]
    argv = shlex.split(run)
    assert argv[:2] == ["pip", "wheel"]
    wheels = tmp_path / "wheels"
    argv = [sys.executable, "-m", *argv[:-1], "--wheel-dir", str(wheels), "-q", str(src)]
    argv = [a for i, a in enumerate(argv) if a != "/wheels" and not (a == "--wheel-dir" and argv[i + 1] == "/wheels")]
    subprocess.run(argv, check=True, timeout=300)
    (wheel,) = wheels.glob("rank_watchdog-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "watchdog/cli.py" in names and "watchdog/agent/main.py" in names and "watchdog/py.typed" in names
