"""watchdog timeline on journals of real runs: ``watchdog demo`` (torchrun, 4 gloo
ranks on CPU, the hook, a real agent that journals evidence, a real coordinator)
with one fault each (the conftest's fault_run: the same runs test_e2e_faults.py and
test_e2e_evidence.py assert on), plus a hang answered by a restart.
Then the reports: the text names the culprit first, the Perfetto JSON is a valid
trace, the HTML has the culprit's lane and the stacks, and headless Chromium
renders it without console errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import headless
import pytest
from timeline_support import check_trace, torn, without_evidence

from watchdog.contracts.finding import ranks_phrase
from watchdog.dev import scenario
from watchdog.timeline import html, load, perfetto, text
from watchdog.timeline.model import Lane, RankNow

pytestmark = pytest.mark.integration

# fault -> (kind of the root cause, the injected culprit): the conftest's shared runs, which
# tests/test_e2e_faults.py and test_e2e_evidence.py read too
FAULTS = {
    "hang:2@30": ("collective_hang", 2),
    "stop:3@25": ("frozen_rank", 3),
    "kill:1@20": ("dead_rank", 1),
    "slow:2:1.3": ("straggler", 2),
}
HANG = "hang:2@30"
HANG_STEP = 30


@pytest.fixture(scope="module")
def runs(fault_run) -> dict[str, scenario.ScenarioResult]:
    return {fault: fault_run(fault) for fault in FAULTS}


@pytest.fixture(scope="module")
def restarted(restart_run) -> Path:
    """A hang the coordinator's policy answers with a restart: torchrun brings the
    group back from its checkpoint, the journal gets a second incarnation (the
    conftest's restart_run, test_e2e_actions.py's bit-exact restart)."""
    return Path(restart_run(HANG).summary["journal"])


def _journal(res: scenario.ScenarioResult) -> Path:
    return Path(res.summary["journal"])


@pytest.mark.parametrize("fault", FAULTS)
def test_text_names_the_culprit_first(runs, fault):
    kind, culprit = FAULTS[fault]
    res = runs[fault]
    tl = load.load(str(_journal(res)))
    assert len(tl.sections) == 1 and tl.skipped_lines == 0
    sec = tl.sections[0]
    root = sec.root
    assert root is not None
    ranks = root["ranks"]
    if fault.startswith("kill"):
        # torchrun tears the others down within the agent's 0.1 s poll: the coordinator
        # may name the whole cascade ("order unknown"); the culprit must be in it
        assert culprit in ranks
    else:
        assert ranks == [culprit], res.findings
    assert root["kind"] == kind
    lines = [x for x in text.render(tl).splitlines() if x.strip()]
    assert lines[2] == f"ROOT CAUSE: {kind} naming {ranks_phrase(ranks)}"
    assert lines[4] == f"  {root['reason']}"
    header = next(i for i, x in enumerate(lines) if x.startswith("  rank  host"))
    first_row = lines[header + 1].split()
    assert first_row[0] == f"{ranks[0]}*"  # culprit rows first
    order = [int(x.split()[0].rstrip("*")) for x in lines[header + 1 : header + 5]]
    assert order.index(culprit) < len(ranks) and sorted(order) == [0, 1, 2, 3]
    assert f"watchdog timeline {_journal(res)}" == res.summary["timeline"]  # what the demo prints


def _now(lane: Lane) -> RankNow:
    """What ``lane``'s rank was doing at the end (every rank here has a slot snapshot)."""
    assert lane.now is not None, lane.rank
    return lane.now


def test_the_hang_post_mortem_has_every_rank_and_both_stacks(runs):
    sec = load.load(str(_journal(runs[HANG]))).sections[0]
    assert sec.has_slots and sec.evidence_events >= 1
    now = {r: _now(lane) for r, lane in sec.lanes.items()}
    waiting = [r for r in (0, 1, 3) if now[r].activity == "collective"]
    assert waiting == [0, 1, 3]
    seq = now[0].coll_seq
    assert seq is not None
    assert {now[r].coll_seq for r in waiting} == {seq} and now[2].coll_seq == seq - 1
    assert now[2].activity == "code" and sec.lanes[2].steps[-1].step == HANG_STEP
    out = text.render(load.load(str(_journal(runs[HANG]))))
    assert re.search(r"stack of rank 2 \(culprit, py-spy dump[^)]*\):\n +Thread \d+ \(\w+\): \"MainThread\"", out)
    waiter = sec.waiter()
    assert waiter in (0, 1, 3) and f"stack of rank {waiter} (waiting, py-spy dump" in out
    assert "backward" in out  # the waiter is blocked in DDP's all-reduce inside backward


@pytest.mark.parametrize("fault", FAULTS)
def test_perfetto_is_a_valid_trace(runs, fault, tmp_path):
    tl = load.load(str(_journal(runs[fault])))
    events = check_trace(json.loads(json.dumps(perfetto.render(tl))))
    hosts = {
        e["pid"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] != "coordinator (journal)"
    }
    assert len(hosts) == 1
    threads = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] in hosts}
    assert threads == {0, 1, 2, 3}
    sec = tl.sections[0]
    for r, lane in sec.lanes.items():
        steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "step" and e["tid"] == r]
        assert len([e for e in steps if "in progress" not in e["name"]]) == len(lane.steps)
    assert any(e.get("cat") == "finding" and e["s"] == "g" for e in events)


@pytest.mark.parametrize("fault", FAULTS)
def test_html_has_the_culprit_lane_and_its_stacks(runs, fault):
    _, culprit = FAULTS[fault]
    tl = load.load(str(_journal(runs[fault])))
    page = html.render(tl)
    assert re.search(rf'class="lane culprit-label"[^>]*data-rank="{culprit}">rank {culprit} ✗', page)
    assert re.search(rf'<tr class="culprit" data-rank="{culprit}">', page)
    lane = tl.sections[0].lanes[culprit]
    if any(s.ok for s in lane.stacks):  # the agent dumps live culprits; a dead one has no stack
        assert re.search(rf'<pre class="stack" data-rank="{culprit}">[^<]*MainThread', page)
    if fault.startswith(("hang", "stop")):
        assert lane.stacks and any(s.ok for s in lane.stacks), "the agent journaled no stack of the culprit"


def test_torn_and_evidence_less_journals_of_a_real_run(runs, tmp_path):
    src = _journal(runs[HANG])
    t = load.load(str(torn(src, tmp_path / "torn.jsonl")))
    root = t.sections[0].root
    assert t.skipped_lines == 1 and root is not None and root["ranks"] == [2]
    old = load.load(str(without_evidence(src, tmp_path / "old.jsonl")))
    out = text.render(old)
    assert [x for x in out.splitlines() if x.strip()][2] == "ROOT CAUSE: collective_hang naming rank 2"
    assert "slot evidence missing" in out and "waiting in ddp_all_reduce #" in out
    check_trace(perfetto.render(old))
    assert "slot evidence missing" in html.render(old)


def test_a_restarted_job_has_a_section_per_incarnation_and_the_restart_story(restarted, tmp_path):
    tl = load.load(str(restarted))
    first, second = tl.sections[:2]
    assert (first.opened_by, second.opened_by) == ("start", "restart")
    root = first.root
    assert root is not None and root["kind"] == "collective_hang" and root["ranks"] == [2]
    assert {lane.pid for lane in first.lanes.values()}.isdisjoint({lane.pid for lane in second.lanes.values()})
    assert sorted(second.lanes) == [0, 1, 2]
    out = text.render(tl)
    story = out[out.index("actions:\n", out.index("== section 1")) : out.index("== section 2")]
    for line in (
        "restart for collective_hang rank 2",
        "signal SIGTERM sent to ranks 0-2",
        "restart 1: workers 0-2 stopped",
        f"resumed from step {HANG_STEP} with 3 ranks",
        f"outcome ok: restart 1, resumed from step {HANG_STEP}",
    ):
        assert line in story, story
    assert "== section 2 of" in out and "ranks restarted" in out
    events = check_trace(perfetto.render(tl))
    steps = [e for e in events if e["ph"] == "X" and e.get("cat") == "step" and e["tid"] == 2]
    assert 1 in {e["args"].get("section") for e in steps}  # the first incarnation's steps, from its evidence
    page = html.render(tl)
    assert page.count('<section class="sec"') == len(tl.sections) and "<h3>What was done</h3>" in page


def _pixels(img) -> list[tuple[int, int, int]]:
    raw = img.tobytes()  # RGB, row by row (getdata() is going away in Pillow 14)
    return list(zip(raw[0::3], raw[1::3], raw[2::3]))


@pytest.mark.skipif(headless.chromium() is None, reason="needs chromium (apt-get install chromium; .ci/setup does)")
def test_chromium_renders_the_report_without_console_errors(runs, tmp_path):
    from PIL import Image

    page = tmp_path / "timeline.html"
    page.write_text(html.render(load.load(str(_journal(runs[HANG])))))
    png, netlog = tmp_path / "timeline.png", tmp_path / "net.json"
    log = headless.screenshot(page, png, netlog=netlog)
    assert headless.console_messages(log) == []
    assert headless.page_requests(netlog) == []  # self-contained: nothing fetched
    img = Image.open(png).convert("RGB")
    assert img.size == (1400, 900)
    pixels = _pixels(img.resize((350, 225)))
    colours = len(set(pixels))
    ink = sum(1 for p in pixels if min(p) < 235) / len(pixels)
    assert colours > 50 and ink > 0.15, (colours, ink)

    # the report's own colours made it to the screen: culprit red, collective orange
    def near(c, ref, tol=40):
        return all(abs(a - b) <= tol for a, b in zip(c, ref))

    full = _pixels(img)
    assert sum(near(p, (0xD6, 0x27, 0x28)) for p in full) > 200
    assert sum(near(p, (0xF2, 0x8E, 0x2B)) for p in full) > 2000
    dom, log2 = headless.dump_dom(page)
    assert headless.console_messages(log2) == []
    assert 'data-timeline="ready"' in dom  # the script ran to its end
    assert 'class="tick"' in dom
    # the script's zoom ("#last=0.5" opens on the last half second) moves what it should
    zoomed, log3 = headless.dump_dom(page, "#last=0.5")
    assert headless.console_messages(log3) == []
    x = re.compile(r'<rect class="seg coll open"[^>]*?\sx="(-?[\d.]+)"')
    assert x.findall(dom) and x.findall(zoomed) and x.findall(dom) != x.findall(zoomed)
