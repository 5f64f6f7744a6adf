"""The ``watchdog`` command: a thin dispatcher to each subcommand's module.

Subcommands are imported lazily so that ``watchdog agent`` never imports torch
or the coordinator, and a broken optional piece cannot take the others down.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib import metadata

DISTRIBUTION = "rank-watchdog"

# name -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("watchdog.agent.main", "per-host agent: reads rank slots, exports /metrics, reports to the coordinator"),
    "coordinator": ("watchdog.coordinator.cli.coordinator", "per-job coordinator: cluster view, detectors, journal"),
    "run": (
        "watchdog.hook.zero_code.run_cli",
        "run any launcher command (torchrun, srun, mpirun, python) with every rank monitored",
    ),
    "doctor": (
        "watchdog.doctor.main",
        "pre-flight checks of this host (run dir, ptrace, py-spy, NVML, ports, token, coordinator), each with its fix",
    ),
    "status": ("watchdog.coordinator.cli.status", "print a live per-rank table from a coordinator"),
    "slots": ("watchdog.agent.slots_cli", "print the rank slots found in a run directory (no agent needed)"),
    "demo": ("watchdog.dev.demo", "run a monitored multi-rank CPU job locally, end to end"),
    "hosts": (
        "watchdog.coordinator.cli.hosts",
        "hosts that keep failing over all jobs, from Prometheus, with exclude lines",
    ),
    "scaling": (
        "watchdog.scaling.main",
        "scaling efficiency, compute vs communication per world size, from the journals of runs at 1, 2, 4, ... workers",
    ),
    "timeline": (
        "watchdog.timeline.main",
        "post-mortem from a journal: root cause first, per-rank lanes (text/HTML/Perfetto)",
    ),
}

# The extra that brings a command's dependencies (pyproject.toml): the plain package
# is the hook alone, so on a training image these commands name what to install.
EXTRA_OF: dict[str, str] = {
    "agent": "agent",
    "slots": "agent",
    "coordinator": "coordinator",
    "status": "coordinator",
    "hosts": "coordinator",
    "scaling": "coordinator",
    "demo": "all",
    "doctor": "agent",  # structlog, through the daemons' own modules it reads its checks from
}

# Commands that start other commands as child processes. Their modules are imported up
# front, so a missing extra is named here rather than as a child's traceback mid-run.
STARTS: dict[str, tuple[str, ...]] = {"demo": ("agent", "coordinator")}


def package_version() -> str:
    """The installed distribution's version (``watchdog --version``, the build-info metric)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def _usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = [
        "usage: watchdog <command> [flags]   (watchdog <command> --help for its flags)",
        "       watchdog --version",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {helptext}" for name, (_, helptext) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("--version", "-V", "version"):
        print(f"{DISTRIBUTION} {package_version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"watchdog: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
        for child in STARTS.get(name, ()):
            importlib.import_module(SUBCOMMANDS[child][0])
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if name not in EXTRA_OF or missing in ("", "watchdog"):
            raise
        print(
            f"watchdog {name}: needs {missing}, which is not installed: "
            f"pip install 'rank-watchdog[{EXTRA_OF[name]}]' (the plain package is the hook alone)",
            file=sys.stderr,
        )
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
