"""Agent flags: CLI > WATCHDOG_ env > default, clear errors, secrets kept out of logs."""

from dataclasses import replace

import pytest

from watchdog import flags, rundir
from watchdog.agent import config
from watchdog.agent.main import main
from watchdog.flags import FlagError


def load(argv, env=None):
    return config.load(["--run-dir", "/r", *argv], env or {})


def test_defaults():
    c = load([])
    assert (c.run_dir, c.listen, c.job, c.poll_interval_s, c.report_interval_s, c.stale_after_s) == (
        "/r",
        ("0.0.0.0", 19400),
        "",
        0.1,
        1.0,
        30.0,
    )
    assert c.coordinator_url == "" and c.token == "" and c.accelerator and c.host


def test_cli_beats_env_beats_default():
    env = {
        "WATCHDOG_POLL_INTERVAL_SECONDS": "0.05",
        "WATCHDOG_JOB_NAME": "from-env",
        "WATCHDOG_WEB_LISTEN_ADDRESS": "127.0.0.1:0",
    }
    c = load(["--job.name", "from-cli"], env)
    assert c.job == "from-cli" and c.poll_interval_s == 0.05 and c.listen == ("127.0.0.1", 0)
    assert config.load([], {"WATCHDOG_RUN_DIR": "/env"}).run_dir == "/env"


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--poll.interval-seconds", "0"], {}, "--poll.interval-seconds='0': must be > 0"),
        ([], {"WATCHDOG_STALE_AFTER_SECONDS": "soon"}, "WATCHDOG_STALE_AFTER_SECONDS='soon'"),
        (["--web.listen-address", "19400"], {}, "must be HOST:PORT"),
        (["--coordinator.url", "coord:9500"], {}, "must start with http://"),
        (["--log.level", "loud"], {}, "must be one of debug"),
        (["--collector.accelerator", "maybe"], {}, "--collector.accelerator='maybe'"),
        (["--job.token-file", "/nonexistent/token"], {}, "--job.token-file='/nonexistent/token'"),
    ],
)
def test_bad_values_are_clear_flag_errors(argv, env, message):
    with pytest.raises(FlagError, match=message.replace("(", r"\(").replace("?", r"\?")):
        load(argv, env)


def test_run_dir_defaults_to_the_hooks_default(tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    c = config.load([], env)
    assert c.run_dir == rundir.default_run_dir(env) and c.effective["run-dir"] == c.run_dir


def test_job_and_host_names_read_the_deprecated_hook_variables_with_a_warning():
    c = config.load([], {"WATCHDOG_JOB": "j-old", "WATCHDOG_HOST": "h-old"})
    assert (c.job, c.host) == ("j-old", "h-old")
    assert len(c.deprecations) == 2 and "set WATCHDOG_JOB_NAME instead" in c.deprecations[0]
    c = config.load([], {"WATCHDOG_JOB": "j-old", "WATCHDOG_JOB_NAME": "j"})
    assert c.job == "j" and "ignored" in c.deprecations[0]
    assert config.load(["--job.name", "cli"], {"WATCHDOG_JOB": "j-old"}).job == "cli"
    assert config.load([], {"WATCHDOG_JOB_NAME": "j", "WATCHDOG_HOST_NAME": "h"}).deprecations == ()


def test_log_format_and_level_are_validated():
    assert (load(["--log.format", "logfmt"]).log_format, load([]).log_format) == ("logfmt", "json")
    with pytest.raises(FlagError, match=r"--log.format=.xml.: must be one of json, logfmt"):
        load(["--log.format", "xml"])
    with pytest.raises(FlagError, match="WATCHDOG_LOG_LEVEL='loud'"):
        load([], {"WATCHDOG_LOG_LEVEL": "loud"})


def test_token_file_is_preferred_and_secret_never_logged(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    c = load(["--job.token-file", str(tok), "--job.token", "argv-token"])
    assert c.token == "s3cret" and not c.token_from_argv
    assert "s3cret" not in repr(c) and "s3cret" not in str(c.effective)
    assert c.effective["job.token"] == "<set>"
    c = load([], {"WATCHDOG_JOB_TOKEN": "env-token"})
    assert c.token == "env-token" and not c.token_from_argv
    assert load(["--job.token", "t"]).token_from_argv
    tok.write_text("")
    with pytest.raises(FlagError, match="empty"):
        load(["--job.token-file", str(tok)])


def test_every_flag_fills_a_field_and_every_field_has_a_flag():
    assert flags.unmatched(config.AgentConfig, config.FLAGS, config.NOT_FROM_FLAGS) == []


def test_flag_defaults_are_the_dataclass_defaults():
    c = load([])
    assert c == replace(config.AgentConfig(run_dir="/r", listen=("0.0.0.0", 19400)), host=c.host)


@pytest.mark.parametrize("content", ["", " \n\t\n"])
def test_empty_or_blank_token_file_is_an_error_naming_it(tmp_path, content):
    tok = tmp_path / "token"
    tok.write_text(content)
    with pytest.raises(FlagError, match=f"--job.token-file='{tok}': file holds no token"):
        load(["--job.token-file", str(tok), "--job.token", "inline"])  # no fallback to the inline token


def test_unreadable_token_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FlagError, match=f"--job.token-file='{tmp_path}': Is a directory"):
        load([], {"WATCHDOG_JOB_TOKEN_FILE": str(tmp_path)})


def test_main_reports_flag_errors_with_status_2(capsys):
    assert main(["--run-dir", "/r", "--poll.interval-seconds", "-1"]) == 2
    assert "--poll.interval-seconds='-1': must be > 0" in capsys.readouterr().err


def test_agent_main_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, watchdog.agent.main, watchdog.agent.slots_cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0


def test_job_expiry_flag_has_units_and_a_15_minute_default():
    assert load([]).job_expiry_s == 900.0
    assert load(["--stale.job-expiry-seconds", "60"]).job_expiry_s == 60.0
    with pytest.raises(FlagError, match=r"--stale\.job-expiry-seconds='0'"):
        load(["--stale.job-expiry-seconds", "0"])
