"""Coordinator flags -> frozen Config: one flag table drives the fields; the job
token is read like the agent reads it."""

from __future__ import annotations

import sys

import pytest

from watchdog import flags
from watchdog.coordinator import config
from watchdog.coordinator.cli.coordinator import main
from watchdog.coordinator.cli.status import main as status_main
from watchdog.flags import FlagError


def load(argv, env=None):
    return config.from_values(flags.parse("watchdog coordinator", "", config.FLAGS, argv, env or {}))


def test_every_flag_fills_a_field_and_every_field_has_a_flag():
    assert flags.unmatched(config.Config, config.CONFIG_FLAGS, config.CONFIG_NOT_FROM_FLAGS) == []
    assert flags.unmatched(config.DetectorConfig, config.DETECTOR_FLAGS, config.DETECTOR_NOT_FROM_FLAGS) == []


def test_flag_defaults_are_the_dataclass_defaults():
    assert load([]) == config.Config()


def test_flags_land_in_their_fields():
    c = load(
        ["--hang.floor-seconds", "7", "--job.world-size", "4", "--evidence.collect", "0"],
        {"WATCHDOG_TICK_INTERVAL_SECONDS": "0.5"},
    )
    assert (c.detectors.hang_floor_s, c.world_size, c.evidence, c.tick_s) == (7.0, 4, False, 0.5)


def test_token_file_wins_over_the_inline_token(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("from-file\n")
    assert load(["--job.token", "inline", "--job.token-file", str(tok)]).token == "from-file"
    assert load(["--job.token", "inline"]).token == "inline"
    assert load([]).token == ""


@pytest.mark.parametrize("content", ["", "  \n"])
def test_empty_or_blank_token_file_is_an_error_not_no_token(tmp_path, content):
    # It used to mean "no token": on loopback, unauthenticated reports accepted.
    tok = tmp_path / "token"
    tok.write_text(content)
    with pytest.raises(FlagError, match=f"--job.token-file='{tok}': file holds no token"):
        load(["--job.token-file", str(tok)])


def test_unreadable_token_file_is_a_flag_error_naming_it(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(FlagError, match=f"--job.token-file='{missing}': No such file or directory"):
        load([], {"WATCHDOG_JOB_TOKEN_FILE": str(missing)})


def test_main_and_status_exit_2_on_an_empty_token_file(tmp_path, capsys):
    tok = tmp_path / "token"
    tok.write_text("\n")
    assert main(["--job.token-file", str(tok), "--journal", str(tmp_path / "j")]) == 2
    assert f"--job.token-file='{tok}': file holds no token" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()
    assert status_main(["--job.token-file", str(tok)]) == 2
    assert "file holds no token" in capsys.readouterr().err


def test_job_name_reads_the_deprecated_hook_variable_with_a_warning():
    assert load([], {"WATCHDOG_JOB": "old"}).job == "old"
    assert load([], {"WATCHDOG_JOB": "old", "WATCHDOG_JOB_NAME": "new"}).job == "new"
    (warning,) = flags.deprecations(config.FLAGS, {"WATCHDOG_JOB": "old"})
    assert "WATCHDOG_JOB is deprecated: set WATCHDOG_JOB_NAME" in warning


def test_log_level_and_format_are_validated():
    assert (load(["--log.format", "logfmt", "--log.level", "DEBUG"]).log_format, load([]).log_level) == (
        "logfmt",
        "info",
    )
    with pytest.raises(FlagError, match=r"--log.level='chatty'"):
        load(["--log.level", "chatty"])


def test_event_loop_is_validated_at_start(monkeypatch):
    assert (load(["--web.event-loop", "asyncio"]).event_loop, load([]).event_loop) == ("asyncio", "auto")
    with pytest.raises(FlagError, match=r"--web.event-loop='trio'.*must be one of auto, asyncio, uvloop"):
        load(["--web.event-loop", "trio"])
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    with pytest.raises(FlagError, match="uvloop is not installed"):
        load(["--web.event-loop", "uvloop"])
    assert load(["--web.event-loop", "auto"]).event_loop == "auto"  # runs on asyncio's loop then
