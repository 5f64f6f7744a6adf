"""docs/reference/flags.md: every command's flags, from the flag tables the
commands parse with (``watchdog.flags.Flag`` tuples, or the argparse parser of
the commands that build one), and the hook's settings from its config."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from watchdog import cli, flags
from watchdog.agent import config as agent_config
from watchdog.agent import slots_cli
from watchdog.coordinator import config as coordinator_config
from watchdog.coordinator.cli import hosts, status
from watchdog.dev import demo
from watchdog.doctor import main as doctor
from watchdog.flags import Flag
from watchdog.hook import config as hook_config
from watchdog.hook.zero_code import run_cli
from watchdog.scaling import main as scaling
from watchdog.timeline import main as timeline

from .text import code, comments, shown, table

# Each command's flag tables, (heading, flags); a command without a table builds an argparse parser.
FLAG_TABLES: dict[str, tuple[tuple[str, Sequence[Flag]], ...]] = {
    "agent": (("", agent_config.FLAGS),),
    "coordinator": (("", coordinator_config.CONFIG_FLAGS), ("Detector thresholds", coordinator_config.DETECTOR_FLAGS)),
    "doctor": (("", doctor.FLAGS),),
    "status": (("", status.FLAGS),),
    "slots": (("", slots_cli.FLAGS),),
    "hosts": (("", hosts.FLAGS),),
}
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "demo": demo.parser,
    "scaling": scaling.parser,
    "timeline": timeline.parser,
}
# Switches (a bare --name, no value) of commands with flag tables.
SWITCHES: dict[str, tuple[tuple[str, str], ...]] = {
    "doctor": doctor.SWITCHES,
    "status": status.SWITCHES,
    "hosts": hosts.SWITCHES,
}
# Commands that take no flags of their own: what they take instead.
USAGES = {"run": run_cli.USAGE}

_CONVERTERS: dict[Callable[[str], Any], str] = {
    flags.positive_float: "number > 0",
    flags.non_negative_float: "number >= 0",
    flags.positive_int: "integer > 0",
    flags.boolean: "boolean",
    flags.listen_address: "HOST:PORT",
    float: "number",
    int: "integer",
}
_BY_DEFAULT = {bool: "boolean", int: "integer", float: "number", str: "text", frozenset: "list"}


def _type(f: Flag) -> str:
    return _CONVERTERS.get(f.convert) or _BY_DEFAULT.get(type(f.default), type(f.default).__name__)


def _env(f: Flag) -> str:
    old = f" (also {', '.join(f.old_env)}, deprecated)" if f.old_env else ""
    return code(f.env) + old


def flag_rows(table_flags: Sequence[Flag]) -> list[list[str]]:
    return [
        [code(f"--{f.name}"), _env(f), _type(f), "(secret)" if f.secret else shown(f.default), f.help]
        for f in table_flags
    ]


def _arg_type(a: argparse.Action) -> str:
    if a.choices is not None:
        return "one of " + ", ".join(map(str, a.choices))
    if a.nargs == 0:
        return "switch"
    names: dict[object, str] = {float: "number", int: "integer", None: "text", str: "text"}
    name = names.get(a.type) or str(getattr(a.type, "__name__", "text"))
    return f"{name}, repeatable" if isinstance(a, argparse._AppendAction) else name  # noqa: SLF001 - argparse's class, no public name


def _arg_default(a: argparse.Action) -> str:
    if a.default in (None, False, [], argparse.SUPPRESS):
        return ""
    if isinstance(a.default, str) and os.path.isabs(a.default):
        return "(see help)"  # a path on the machine that rendered this page
    return shown(a.default)


def parser_rows(p: argparse.ArgumentParser) -> list[list[str]]:
    rows = []
    # argparse has no public list of a parser's arguments: its actions are the one.
    for a in p._actions:  # noqa: SLF001
        if isinstance(a, argparse._HelpAction):  # noqa: SLF001
            continue
        name = ", ".join(a.option_strings) or a.dest
        rows.append([code(name), _arg_type(a), _arg_default(a), a.help or ""])
    return rows


def hook_rows() -> list[list[str]]:
    notes = comments(hook_config.HookConfig)
    rows = []
    for f in dataclasses.fields(hook_config.HookConfig):
        env = hook_config.ENV[f.name]
        rows.append(
            [code(f.name), code(env) if env else "(keyword only)", str(f.type), shown(f.default), notes[f.name]]
        )
    return rows


def render() -> str:
    out = [
        "# Flags",
        "",
        "Every command's flags. A dotted flag also reads its environment variable (`WATCHDOG_` and the flag's "
        "name in capitals, dots and dashes as underscores); the command line wins over the environment, "
        "the environment over the default.",
        "",
    ]
    for name, (_, summary) in cli.SUBCOMMANDS.items():
        out += [f"## watchdog {name}", "", summary[0].upper() + summary[1:] + ".", ""]
        if name in FLAG_TABLES:
            for i, (heading, table_flags) in enumerate(FLAG_TABLES[name]):
                if heading:
                    out += [f"### {heading}", ""]
                rows = flag_rows(table_flags)
                if i == 0:
                    rows += [[code(f"--{switch}"), "", "switch", "", what] for switch, what in SWITCHES.get(name, ())]
                out += table(("Flag", "Environment", "Type", "Default", "Help"), rows)
                out.append("")
        elif name in PARSERS:
            out += table(("Flag", "Type", "Default", "Help"), parser_rows(PARSERS[name]()))
            out.append("")
        elif name in USAGES:
            out += ["```", USAGES[name], "```", "", "It takes the hook's settings below from the environment.", ""]
        else:
            raise LookupError(
                f"watchdog {name}: no flag table, parser or usage for the reference (reference/flagpage.py)"
            )
    out += [
        "## The hook",
        "",
        "Each rank's settings: keyword arguments of `install()`, else the environment, else the default.",
        "",
    ]
    out += table(("Setting", "Environment", "Type", "Default", "Meaning"), hook_rows())
    out.append("")
    return "\n".join(out)
