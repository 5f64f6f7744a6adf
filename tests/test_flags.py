"""Dotted flags: precedence CLI > environment > default, every source converted alike."""

from __future__ import annotations

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
