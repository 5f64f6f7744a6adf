"""--log.format: the daemons' log lines as JSON (default) or logfmt, one per event."""

from __future__ import annotations

import json

import pytest
import structlog

from watchdog import logs


@pytest.fixture(autouse=True)
def reset_structlog():
    yield
    structlog.reset_defaults()


def _one_line(capsys, fmt: str, level: str = "info") -> str:
    logs.configure(level, fmt)
    logs.get("watchdog.test").info("rank died", job="j 1", rank=3)
    logs.get("watchdog.test").debug("a tick")
    return capsys.readouterr().err


def test_json_is_the_default_format(capsys):
    (line,) = _one_line(capsys, "json").splitlines()
    rec = json.loads(line)
    assert (rec["event"], rec["job"], rec["rank"], rec["level"]) == ("rank died", "j 1", 3, "info")


def test_logfmt_is_key_value_with_timestamp_level_event_first(capsys):
    (line,) = _one_line(capsys, "logfmt").splitlines()
    assert line.startswith("timestamp=") and ' level=info event="rank died" ' in line
    assert 'job="j 1"' in line and "rank=3" in line


def test_debug_level_lets_debug_through(capsys):
    assert len(_one_line(capsys, "logfmt", "debug").splitlines()) == 2


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="json, logfmt"):
        logs.configure("info", "xml")
