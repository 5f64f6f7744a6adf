"""Secrets and records against other users on the host (issue #14, "network"):
tokens read the same from every source, short ones refused where they would face
a network, a token file readable by everyone warned about, the journal private."""

from __future__ import annotations

import os
import stat

import pytest

from watchdog import flags, jobtoken
from watchdog.agent import config as agent_config
from watchdog.coordinator.cli.coordinator import check_exposure
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import jsonl as journal

LONG = "0123456789abcdef0123456789abcdef"


def values(**kw):
    out = {flags.dest_of(jobtoken.FILE): "", flags.dest_of(jobtoken.INLINE): ""}
    out.update({flags.dest_of(k): v for k, v in kw.items()})
    return out


def test_an_inline_token_is_stripped_like_the_file(tmp_path):
    f = tmp_path / "t"
    f.write_text(LONG + "\n")
    assert jobtoken.read(values(**{jobtoken.INLINE: LONG + "\n"})) == jobtoken.read(values(**{jobtoken.FILE: str(f)}))
    assert jobtoken.read(values(**{jobtoken.INLINE: f"  {LONG}\t"})) == LONG
    with pytest.raises(flags.FlagError, match="only whitespace"):
        jobtoken.read(values(**{jobtoken.INLINE: " \n"}))


def test_the_agent_strips_a_token_from_the_environment():
    cfg = agent_config.load(["--run-dir", "/tmp/x"], {"WATCHDOG_JOB_TOKEN": LONG + "\n"})
    assert cfg.token == LONG


@pytest.mark.parametrize(
    "host,refused",
    [
        ("0.0.0.0", True),
        ("10.0.0.5", True),
        ("node-a", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("localhost", False),
    ],
)
def test_a_short_token_is_refused_on_a_non_loopback_listen(host, refused):
    err = check_exposure(Config(listen=(host, 19401), token="short-token"))
    assert (err is not None) == refused
    if refused:
        assert err is not None and "11 bytes" in err and "at least 16" in err
    assert check_exposure(Config(listen=(host, 19401), token=LONG)) is None


def test_the_agent_refuses_a_short_token_for_a_remote_coordinator():
    with pytest.raises(flags.FlagError, match="at least 16"):
        agent_config.load(
            ["--run-dir", "/tmp/x", "--coordinator.url", "http://coord:19401"], {"WATCHDOG_JOB_TOKEN": "tiny"}
        )
    agent_config.load(
        ["--run-dir", "/tmp/x", "--coordinator.url", "http://127.0.0.1:19401"], {"WATCHDOG_JOB_TOKEN": "tiny"}
    )


def test_a_token_file_readable_by_every_user_is_warned_about(tmp_path):
    f = tmp_path / "job.token"
    f.write_text(LONG)
    os.chmod(f, 0o644)
    warn = jobtoken.file_warning(values(**{jobtoken.FILE: str(f)}))
    assert warn and "readable by every user" in warn and str(f) in warn
    os.chmod(f, 0o640)  # a group (systemd's rank-watchdog) is a deliberate choice
    assert jobtoken.file_warning(values(**{jobtoken.FILE: str(f)})) is None
    cfg = agent_config.load(["--run-dir", "/tmp/x", f"--{jobtoken.FILE}", str(f)], {})
    assert cfg.token_warning == ""
    os.chmod(f, 0o604)
    cfg = agent_config.load(["--run-dir", "/tmp/x", f"--{jobtoken.FILE}", str(f)], {})
    assert "readable by every user" in cfg.token_warning


def test_the_journal_is_created_private(tmp_path):
    old = os.umask(0o022)
    try:
        j = journal.Journal(str(tmp_path / "j.jsonl"), lambda: (0.0, 0.0))
        j.write("start", {})
        j.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "j.jsonl").st_mode) == 0o600


def test_the_agent_refuses_a_report_interval_the_coordinator_would_refuse():
    with pytest.raises(flags.FlagError, match=r"report\.interval-seconds"):
        agent_config.load(["--run-dir", "/tmp/x", "--report.interval-seconds", "0.001"], {})
    assert agent_config.load(["--run-dir", "/tmp/x", "--report.interval-seconds", "0.05"], {}).report_interval_s == 0.05
