"""A policy whose destructive actions could never be carried out is refused at start.

Agents refuse every signal and checkpoint command not signed with the job token
(``no_token``). Before this check a token-less coordinator with a restart policy
started, decided the restart, and had it refused every 10 s while the job stayed hung.
"""

from __future__ import annotations

import pytest

from watchdog import flags
from watchdog.coordinator.cli.coordinator import check_policy_token, main
from watchdog.coordinator.config import FLAGS, from_values


def _policy(tmp_path, body: str):
    path = tmp_path / "policy.toml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("action", ["restart", "abort", "checkpoint_restart", "exclude_host_restart"])
def test_destructive_policy_without_a_token_refuses_to_start(tmp_path, capsys, monkeypatch, action):
    # main configures structlog onto the captured stderr, which later tests would log into after it is closed.
    monkeypatch.setattr("watchdog.logs.configure", lambda *a, **k: None)
    monkeypatch.delenv("WATCHDOG_JOB_TOKEN", raising=False)
    monkeypatch.delenv("WATCHDOG_JOB_TOKEN_FILE", raising=False)
    policy = _policy(tmp_path, f'[actions]\ncollective_hang = "{action}"\n')
    journal = tmp_path / "journal.jsonl"
    assert main(["--policy.file", str(policy), "--journal", str(journal), "--web.listen-address", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "no job token" in err and action in err and str(policy) in err and "no_token" in err
    assert "dry_run" in err  # the way out is named
    assert not journal.exists()  # refused before anything was opened


@pytest.mark.parametrize(
    "body", ['[actions]\ndead_rank = "alert"\n', '[actions]\ndead_rank = "restart"\n[limits]\ndry_run = true\n']
)
def test_alert_only_or_dry_run_policies_start_without_a_token(tmp_path, body):
    cfg = from_values(flags.parse("t", "", FLAGS, ["--policy.file", str(_policy(tmp_path, body))]))
    assert check_policy_token(cfg) is None


def test_a_token_makes_a_destructive_policy_acceptable(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-s3cret-s3cret")
    argv = [
        "--policy.file",
        str(_policy(tmp_path, '[actions]\ndead_rank = "restart"\n')),
        "--job.token-file",
        str(token),
    ]
    assert check_policy_token(from_values(flags.parse("t", "", FLAGS, argv))) is None
