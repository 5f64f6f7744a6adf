"""One host cut off from the network mid-job, for real: two network namespaces made
for this test, joined by a veth pair. Namespace "c" holds the coordinator and host A
(its agent and ranks 0-1); namespace "b" is host B (its agent and ranks 2-3), which
reaches the coordinator only through the veth link. The ranks are fake ones writing
their slots through the real hook writer (agent/testing.py): what is under test is
the monitor's view of a host, not training.

Taking B's link down: host A's ranks go on completing collectives numbered past
the ones B's ranks were last seen in, so B's ranks are taken for alive and the
coordinator names host B unobserved, once (one host_unobserved finding naming no
rank, no host_lost), and sends nothing destructive. Bringing it back: the finding
resolves, nothing new is found. (tests/test_e2e_blind.py cuts only an agent's link
under a real torchrun job.)

Needs root and ``ip`` (iproute2); every address lives inside the namespaces this test
creates and deletes. Skipped, saying so, where namespaces cannot be made.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time

import pytest
from waiting import wait_for

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = pytest.mark.integration

IP = shutil.which("ip")


def _ip(*args: str, ns: str = "") -> None:
    argv = [IP or "ip", *(["netns", "exec", ns, IP or "ip"] if ns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns():
    """Two namespaces (c, b) joined by veth, 10.231.N.1 in c, 10.231.N.2 in b."""
    if os.geteuid() != 0 or IP is None:
        pytest.skip("needs root and iproute2 (ip) to create network namespaces")
    tag = secrets.token_hex(3)
    ns_c, ns_b = f"wdt-c-{tag}", f"wdt-b-{tag}"
    net = int(tag, 16) % 250 + 1
    made = []
    try:
        for ns in (ns_c, ns_b):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "vc", "netns", ns_c, "type", "veth", "peer", "name", "vb", "netns", ns_b)
        _ip("addr", "add", f"10.231.{net}.1/30", "dev", "vc", ns=ns_c)
        _ip("addr", "add", f"10.231.{net}.2/30", "dev", "vb", ns=ns_b)
        _ip("link", "set", "vc", "up", ns=ns_c)
        _ip("link", "set", "vb", "up", ns=ns_b)
    except subprocess.CalledProcessError as exc:
        for ns in made:
            subprocess.run([IP, "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.decode(errors='replace').strip()}")
    yield ns_c, ns_b, f"10.231.{net}.1"
    for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
        subprocess.run([IP, "netns", "del", ns], capture_output=True, timeout=30)


def test_a_host_cut_off_is_named_unobserved_once_and_recovers(tmp_path, netns):
    ns_c, ns_b, coord_ip = netns
    job = "hostcut-" + secrets.token_hex(3)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    os.chmod(token, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    jpath = tmp_path / "journal.jsonl"
    procs: list[localjob.Process] = []
    ranks: list[subprocess.Popen] = []

    def in_ns(ns: str) -> tuple[str, ...]:
        return (IP or "ip", "netns", "exec", ns)

    try:
        coord = localjob.start_daemon(
            "coordinator",
            "coordinator",
            [
                "--job.name",
                job,
                "--job.world-size",
                "4",
                "--journal",
                str(jpath),
                "--tick.interval-seconds",
                "0.25",
                "--web.listen-address",
                f"{coord_ip}:0",
            ],
            tmp_path,
            env,
            prefix=in_ns(ns_c),
        )
        procs.append(coord)
        for host, ns, first in (("hosta", ns_c, 0), ("hostb", ns_b, 2)):
            run_dir = tmp_path / host
            run_dir.mkdir()
            procs.append(
                localjob.start_daemon(
                    f"agent-{host}",
                    "agent",
                    [
                        "--run-dir",
                        str(run_dir),
                        "--job.name",
                        job,
                        "--host.name",
                        host,
                        "--coordinator.url",
                        coord.url,
                        "--report.interval-seconds",
                        "0.5",
                    ],
                    tmp_path,
                    env,
                    prefix=in_ns(ns),
                )
            )
            for rank in (first, first + 1):
                ranks.append(
                    subprocess.Popen(
                        [
                            *in_ns(ns),
                            sys.executable,
                            "-m",
                            "watchdog.agent.testing",
                            "--run-dir",
                            str(run_dir),
                            "--job",
                            job,
                            "--rank",
                            str(rank),
                            "--world-size",
                            "4",
                        ],
                        env=env,
                        stdin=subprocess.DEVNULL,
                    )
                )

        def events(name: str, since: float = 0.0) -> list[dict]:
            return [r for r in journal.read(str(jpath)) if r["event"] == name and r["t_wall"] >= since]

        wait_for(lambda: len(events(je.RANK_JOINED)) >= 4, 60, "every rank known", log=coord.log_path)
        time.sleep(2.0)
        assert events(je.FINDING) == []

        t_cut = time.time()
        _ip("link", "set", "vb", "down", ns=ns_b)
        finding = wait_for(lambda: events(je.FINDING, t_cut), 60, "host B named unobserved", log=coord.log_path)
        time.sleep(4.0)  # several ticks more: still one finding, no host_lost
        found = events(je.FINDING, t_cut)
        findings = [(f["kind"], f["ranks"], f.get("hosts")) for f in found]
        assert findings == [("host_unobserved", [], ["hostb"])], [(f["reason"], f.get("evidence")) for f in found]
        assert "host hostb: no report from its agent" in finding[0]["reason"]
        assert events(je.HOST_LOST, t_cut) == []
        destructive = [c for c in events(je.COMMAND, t_cut) if c.get("type") in ("signal", "checkpoint")]
        assert destructive == []

        t_back = time.time()
        _ip("link", "set", "vb", "up", ns=ns_b)
        resolved = wait_for(lambda: events(je.RESOLVED, t_back), 30, "the finding resolved", log=coord.log_path)
        assert resolved[0]["kind"] == "host_unobserved" and resolved[0]["ranks"] == []
        time.sleep(3.0)
        assert events(je.FINDING, t_back) == []  # nothing new from B's first reports after the gap
    finally:
        for r in ranks:
            r.kill()
            r.wait(10)
        for p in procs:
            p.stop()
