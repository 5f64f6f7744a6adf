"""Dotted flags: precedence CLI > environment > default, every source converted alike."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from watchdog import flags

FLAGS = (
    flags.Flag("web.listen-address", "127.0.0.1:9400", "where", flags.listen_address),
    flags.Flag("poll.interval-seconds", 0.1, "how often", flags.positive_float),
)


def parse(argv, env=None):
    return flags.parse("t", "test", FLAGS, argv, env or {})


def test_defaults_are_converted_like_typed_values():
    assert parse([]) == {"web_listen_address": ("127.0.0.1", 9400), "poll_interval_seconds": 0.1}


def test_cli_beats_env_beats_default():
    env = {"WATCHDOG_WEB_LISTEN_ADDRESS": "127.0.0.1:1"}
    assert parse([], env)["web_listen_address"] == ("127.0.0.1", 1)
    assert parse(["--web.listen-address", "127.0.0.1:2"], env)["web_listen_address"] == ("127.0.0.1", 2)


def test_bad_env_value_names_its_source():
    with pytest.raises(flags.FlagError, match="WATCHDOG_POLL_INTERVAL_SECONDS='-1': must be > 0"):
        parse([], {"WATCHDOG_POLL_INTERVAL_SECONDS": "-1"})


@dataclass(frozen=True)
class _Cfg:
    listen: tuple[str, int]
    poll_s: float = 1.0
    derived: str = ""


TABLE = (
    flags.Flag("web.listen-address", "127.0.0.1:9400", "where", flags.listen_address, field="listen"),
    flags.Flag("poll.interval-seconds", 0.1, "how often", flags.positive_float, field="poll_s"),
)


def test_build_fills_each_field_its_flag_names_and_computed_ones():
    values = flags.parse("t", "test", TABLE, ["--poll.interval-seconds", "2"], {})
    assert flags.build(_Cfg, TABLE, values, derived="x") == _Cfg(("127.0.0.1", 9400), 2.0, "x")


def test_build_refuses_two_flags_filling_one_field_unless_it_is_computed():
    table = (*TABLE, flags.Flag("poll.other", 0.5, "again", flags.positive_float, field="poll_s"))
    values = flags.parse("t", "test", table, [], {})
    with pytest.raises(TypeError, match="poll_s"):
        flags.build(_Cfg, table, values)
    assert flags.build(_Cfg, table, values, poll_s=3.0).poll_s == 3.0


def test_unmatched_names_what_drifted():
    assert flags.unmatched(_Cfg, TABLE, not_from_flags=("derived",)) == []
    table = (flags.Flag("a", "", "no field"), flags.Flag("b", "", "bad field", field="nope"))
    assert flags.unmatched(_Cfg, table) == [
        "flag --a fills no field",
        "flag --b names _Cfg.nope, which does not exist",
        "_Cfg.derived has no flag",
        "_Cfg.listen has no flag",
        "_Cfg.poll_s has no flag",
    ]
