"""docs/reference/metrics.md: every series the agent and the coordinator export,
from the agent's metric specs and the coordinator's registry (the golden files
in tests/golden pin the same names)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from watchdog.agent.export import metrics as agent_metrics
from watchdog.coordinator import host_culprits
from watchdog.coordinator.metrics import CoordinatorMetrics

from .text import code, table

# The agent's spec tuples, each a section; the specs in none of them follow as the agent's own.
AGENT_GROUPS = (
    (
        f"Per rank ({agent_metrics.SERIES_PER_RANK} series per rank at full detail)",
        agent_metrics.RANK_SPECS,
    ),
    ("Per rank, only where the rank measures them", agent_metrics.OPTIONAL_SPECS),
    (
        f"Per job and host ({agent_metrics.HOST_SERIES} series, at every detail level)",
        agent_metrics.HOST_SPECS,
    ),
    ("Accelerators", agent_metrics.ACCEL_SPECS),
)


def agent_specs() -> list[agent_metrics.Spec]:
    """Every spec the agent's metrics module defines, in the order it defines them."""
    out: list[agent_metrics.Spec] = []
    for value in vars(agent_metrics).values():
        if isinstance(value, agent_metrics.Spec) and value not in out:
            out.append(value)
    return out


def _labels(labels: tuple[str, ...] | list[str]) -> str:
    return ", ".join(code(x) for x in labels)


def agent_sections() -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    grouped = {s.name for _, specs in AGENT_GROUPS for s in specs}
    rest = [s for s in agent_specs() if s.name not in grouped]
    sections = [*AGENT_GROUPS, ("The agent, its job and its host", tuple(rest))]
    return [(title, [(code(s.name), s.kind, _labels(s.labels), s.help) for s in specs]) for title, specs in sections]


def coordinator_rows() -> list[tuple[str, str, str, str]]:
    """(name as exposed, type, labels, help) in the coordinator's exposition order."""
    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry)
    labels: dict[str, tuple[str, ...]] = {host_culprits.NAME: host_culprits.LABELS}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            # prometheus_client keeps a metric's label names private; there is no accessor.
            labels[next(iter(value.describe())).name] = tuple(value._labelnames)  # noqa: SLF001
    rows = []
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        rows.append((code(name), family.type, _labels(labels.get(family.name, ())), family.documentation))
    return rows


def render() -> str:
    header = ("Series", "Type", "Labels", "Help")
    out = [
        "# Metrics",
        "",
        "Every series the agent and the coordinator export on `/metrics`. Names are an API: a change is a "
        "breaking change. The training job is the label `training_job`, never `job` (Prometheus' own).",
        "",
        "## Agent",
        "",
    ]
    for title, rows in agent_sections():
        out += [f"### {title}", ""]
        out += table(header, rows)
        out.append("")
    out += ["## Coordinator", ""]
    out += table(header, coordinator_rows())
    out.append("")
    return "\n".join(out)
