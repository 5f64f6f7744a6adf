"""--help texts that list things (faults, actions, series counts, choices) list
exactly what the code accepts: each is checked against the constant it is made
from, so a new fault, action or series cannot be left out of the help."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import sys

import pytest

from watchdog import logs
from watchdog.agent import config as agent_config
from watchdog.agent.export.metrics import SERIES_PER_RANK
from watchdog.agent.export.rankmetrics import DETAILS
from watchdog.coordinator import config as coordinator_config
from watchdog.coordinator import event_loops
from watchdog.coordinator.cli import hosts, status
from watchdog.coordinator.vocabularies import ACTIONS
from watchdog.dev import demo, localjob
from watchdog.doctor import main as doctor
from watchdog.doctor.check import ROLES


def _help(table, name: str) -> str:
    return next(f.help for f in table if f.name == name)


def _option(parser: argparse.ArgumentParser, option: str) -> argparse.Action:
    return next(a for a in parser._actions if option in a.option_strings)


def test_agent_help_counts_the_series_per_rank_and_names_the_details():
    text = _help(agent_config.FLAGS, "metrics.rank-detail")
    assert re.findall(r"\((\d+) per rank\)", text) == [str(SERIES_PER_RANK)]
    assert all(detail in text for detail in DETAILS)


def test_policy_file_help_lists_every_action():
    text = _help(coordinator_config.CONFIG_FLAGS, "policy.file")
    found = re.search(r"-> (\S+),", text)
    assert found is not None, text
    assert found.group(1).split("/") == list(ACTIONS)


def test_demo_action_choices_are_the_policy_actions_that_act():
    assert _option(demo.parser(), "--action").choices == [a for a in ACTIONS if a != "alert"]


@pytest.mark.parametrize(
    ("text", "choices"),
    [
        (_help(coordinator_config.CONFIG_FLAGS, "log.level"), logs.LEVELS),
        (_help(coordinator_config.CONFIG_FLAGS, "log.format"), logs.FORMATS),
        (_help(coordinator_config.CONFIG_FLAGS, "web.event-loop"), event_loops.CHOICES),
        (_help(doctor.FLAGS, "role"), ROLES),
    ],
    ids=["log.level", "log.format", "web.event-loop", "doctor-role"],
)
def test_help_names_every_choice(text, choices):
    assert [c for c in choices if not re.search(rf"\b{re.escape(c)}\b", text)] == []


def _example(monkeypatch):
    spec = importlib.util.spec_from_file_location("train_ddp_example", localjob.EXAMPLE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_demo_fault_help_lists_exactly_the_faults_the_example_accepts(monkeypatch):
    """Every form listed parses and injects something; every kind of fault the
    example's Faults holds is injected by some listed form (a new fault must be listed)."""
    text = _option(demo.parser(), "--fault").help or ""
    found = re.search(r"one of (.*?) \(R: ", text)
    assert found is not None, text
    listed = found.group(1).split(", ")
    assert listed == list(demo.fault_forms()) and len(listed) == len(set(listed))
    example = _example(monkeypatch)
    none = example.Faults()
    injected = set()
    for form in listed:
        spec = form.replace("[:N]", ":6").replace("R", "1").replace("S", "2").replace("F", "1.5")
        faults = example.parse_faults([spec])
        changed = {f.name for f in dataclasses.fields(faults) if getattr(faults, f.name) != getattr(none, f.name)}
        assert changed, f"--fault {spec} (listed as {form}) injects nothing"
        injected |= changed
    kinds = {f.name for f in dataclasses.fields(none)} - {"mismatch_elements"}  # a parameter of mismatch
    assert kinds - injected == set(), "faults the example injects that the demo's help does not list"


@pytest.mark.parametrize("command", [status, hosts, doctor], ids=["status", "hosts", "doctor"])
def test_help_names_every_switch(command, capsys):
    with pytest.raises(SystemExit) as done:
        command.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.findall(r"--(\w+) \(", text.split("Switches: ", 1)[1]) == [name for name, _ in command.SWITCHES]
