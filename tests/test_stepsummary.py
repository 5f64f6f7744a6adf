"""Step summaries: agents compute their ranks' step statistics
(``watchdog.agent.reporting.stepsummaries``) and the coordinator takes them instead of
computing them (``steps.with_summary``). What a user relies on: the detectors
read the same numbers either way, whatever the wire does to reports (lost,
refused, answered but the answer lost, ranks restarted, the coordinator
restarted); a summary that does not fit is never used; a hostile one costs its
rank only, with a clear message."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest

from watchdog.agent.reporting.sender import plain
from watchdog.agent.reporting.stepsummaries import StepSummaries
from watchdog.contracts import stepsummary
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config, DetectorConfig
from watchdog.coordinator.intake.api import ReportHandler
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.view.cluster import Folder
from watchdog.report import HostReport, RankState, ReportError, StepSample, as_rows
from watchdog.stepstats.steps import StepStats, add_samples, summary_config

CFG = DetectorConfig(straggler_window_steps=5, starvation_window_steps=8, history_steps=120)
SETTINGS = list(summary_config(CFG))
REPLY = {"ok": True, "commands": [], "step_summary_config": SETTINGS}


def stats_of(st: StepStats) -> tuple:
    """Every field a detector reads, the derived ones too (compare=False in the dataclass)."""
    return (
        st.steps_seen,
        tuple(st.history),
        st.windows,
        st.windows_scanned,
        st.p99_step_s,
        st.train_steps,
        st.data_share,
        tuple(st.flat),
    )


def wire(rep: HostReport, version: int) -> HostReport:
    """Through JSON as the sender sends it and the coordinator reads it."""
    body = json.loads(json.dumps(plain(rep)))
    if version == 2:
        body = json.loads(json.dumps(as_rows(body)))
    dropped: list = []
    out = HostReport.from_dict(body, dropped)
    assert not dropped
    return out


def sample(rng: random.Random, step: int) -> StepSample:
    phase = rng.choice(("train",) * 6 + ("eval", "checkpoint"))
    step_s = rng.choice((0.1, 0.2, 0.25, round(rng.uniform(0.05, 2.0), 3)))  # ties, and not
    data_s = rng.choice((0.0, 0.01, round(rng.uniform(0.0, step_s), 4)))
    return StepSample(step, step_s, data_s, round(rng.uniform(0.0, step_s - data_s), 4), phase)


class Rank:
    """A rank's step ring as the agent reads it: samples stay unreported until a
    report carrying them is accepted (sender.py marks them then)."""

    def __init__(self, r: int, pid: int) -> None:
        self.r, self.pid, self.step = r, pid, 0
        self.unreported: list[StepSample] = []

    def run(self, rng: random.Random) -> None:
        for _ in range(rng.choice((0, 1, 3, 4, 4, 7))):
            self.step += rng.choice((1, 1, 1, 2))  # a skipped number: a step the ring overwrote
            self.unreported.append(sample(rng, self.step))

    def state(self) -> RankState:
        return t.rank(self.r, pid=self.pid, step=self.step, recent_steps=self.unreported[-256:])


def scenario(seed: int, version: int, restart_coordinator: bool = False) -> tuple[Folder, Folder, list[int]]:
    """An agent of two ranks and two coordinators, one taking its summaries and one
    fed the same reports without them; reports are lost (or refused), or accepted
    with the reply lost, a rank restarts, and (optionally) the summarising coordinator
    restarts. After every accepted report both views' statistics are compared."""
    rng = random.Random(seed)
    agent = StepSummaries()
    ranks = [Rank(0, 100), Rank(1, 101)]
    taking, computing = Folder(t.view({})), Folder(t.view({}))
    for seq in range(1, 160):
        for rk in ranks:
            rk.run(rng)
        if seq == 70:
            ranks[1] = Rank(1, 201)  # restarted: a new incarnation starts over on both sides
        if restart_coordinator and seq == 150:
            taking = Folder(t.view({}))  # the agent keeps its statistics; the new coordinator has no history
        rep = agent.add(t.report("h", [rk.state() for rk in ranks], seq=seq))
        fate = rng.choice(("accepted",) * 5 + ("lost", "reply lost"))
        if fate == "lost":
            agent.failed()
            continue
        got = wire(rep, version)
        taking.fold(got, float(seq), CFG)
        computing.fold(replace(got, ranks=tuple(replace(r, step_summary=()) for r in got.ranks)), float(seq), CFG)
        if fate == "reply lost":  # folded, but the agent saw a timeout: the samples come again
            agent.failed()
            continue
        agent.accepted("job", REPLY)
        for rk in ranks:
            rk.unreported = []
        if restart_coordinator and seq >= 150:
            continue  # compared below, differently
        for r in (0, 1):
            assert stats_of(taking.snapshot().ranks[r].step_stats) == stats_of(
                computing.snapshot().ranks[r].step_stats
            ), (seed, seq, r)
    return taking, computing, taking.step_summaries


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(12))
def test_summarised_statistics_are_the_computed_ones_bit_for_bit(seed, version):
    _, _, (used, computed) = scenario(seed, version)
    # Taken on nearly every report: not where the agent had kept nothing yet (its first
    # report, a restarted rank's warm-up) nor where the report before was answered but lost.
    assert used > 150 and computed <= used // 4


def test_after_a_coordinator_restart_the_agents_statistics_are_taken_and_windows_follow():
    taking, computing, _ = scenario(3, 2, restart_coordinator=True)
    for r in (0, 1):
        new, old = taking.snapshot().ranks[r].step_stats, computing.snapshot().ranks[r].step_stats
        # The agent's statistics, over samples the new coordinator never saw: those of the
        # coordinator that saw every report.
        assert (new.p99_step_s, new.train_steps, new.data_share) == (old.p99_step_s, old.train_steps, old.data_share)
        assert len(new.history) < len(old.history)
        # Windows closed since the restart, the same as the other coordinator's; none made up.
        assert new.windows and len(new.windows) < len(old.windows)
        assert new.windows == old.windows[-len(new.windows) :]


def test_a_summary_under_other_settings_or_not_ending_at_the_newest_sample_is_not_used():
    samples = t.steps(1, 30, step_s=0.3, data_s=0.1)
    agent = StepSummaries()
    agent.add(t.report("h", [t.rank(0, recent_steps=samples[:10])]))
    agent.accepted("job", REPLY)
    rep = agent.add(t.report("h", [t.rank(0, recent_steps=samples[10:])], seq=2))
    (summary,) = (r.step_summary for r in rep.ranks)
    assert summary and rep.step_summary_config == tuple(SETTINGS)

    def folded(rep: HostReport, cfg: DetectorConfig) -> tuple[StepStats, list[int]]:
        f = Folder(t.view({}))
        f.fold(t.report("h", [t.rank(0, recent_steps=samples[:10])]), 1.0, cfg)
        f.fold(rep, 2.0, cfg)
        return f.snapshot().ranks[0].step_stats, f.step_summaries

    forged = (summary[0], 99.0, *summary[2:])  # claiming another p99
    other = DetectorConfig(straggler_window_steps=5, starvation_window_steps=8, history_steps=41)
    st, tally = folded(replace(rep, ranks=(replace(rep.ranks[0], step_summary=forged),)), other)
    assert st.p99_step_s == 0.3 and tally == [0, 0]  # other settings: not even looked at
    late = (summary[0] - 1, 99.0, *summary[2:])  # the agent's newest sample is not the coordinator's
    st, tally = folded(replace(rep, ranks=(replace(rep.ranks[0], step_summary=late),)), CFG)
    assert st.p99_step_s == 0.3 and tally == [0, 1]
    st, tally = folded(replace(rep, ranks=(replace(rep.ranks[0], step_summary=forged),)), CFG)
    assert st.p99_step_s == 99.0 and tally == [1, 0]  # fits: taken as sent (an agent is trusted with its samples too)


def test_the_agent_sends_none_until_a_reply_gives_settings_and_starts_over_when_they_change():
    agent = StepSummaries()
    first = agent.add(t.report("h", [t.rank(0, recent_steps=t.steps(1, 6))]))
    assert first.step_summary_config == () and first.ranks[0].step_summary == ()
    agent.accepted("job", {"ok": True})  # an older coordinator: no settings
    assert agent.add(t.report("h", [t.rank(0, recent_steps=t.steps(7, 4))], seq=2)).ranks[0].step_summary == ()
    agent.accepted("job", {**REPLY, "step_summary_config": [2, 256, "x", 20, 4]})  # malformed: as none
    assert agent.config == ()
    agent.add(t.report("h", [t.rank(0, recent_steps=t.steps(11, 4))], seq=3))
    agent.accepted("job", REPLY)  # the first settings: what this report's coordinator folded first
    rep = agent.add(t.report("h", [t.rank(0, recent_steps=t.steps(15, 4))], seq=4))
    expected = add_samples(add_samples(StepStats(), t.steps(11, 4), CFG), t.steps(15, 4), CFG)
    assert rep.ranks[0].step_summary[: stepsummary.HEAD] == head(expected)
    # Another coordinator's settings (restarted with other flags): start over from the report it answered.
    agent.accepted("job", {**REPLY, "step_summary_config": [1, 100, 8, 5, 4]})
    rep = agent.add(t.report("h", [t.rank(0, recent_steps=t.steps(19, 4))], seq=5))
    other = DetectorConfig(warmup_steps=1, history_steps=100, starvation_window_steps=8, straggler_window_steps=5)
    expected = add_samples(add_samples(StepStats(), t.steps(15, 4), other), t.steps(19, 4), other)
    assert rep.ranks[0].step_summary[: stepsummary.HEAD] == head(expected) and expected.train_steps == 7


def head(st: StepStats) -> tuple[float, ...]:
    return (float(st.history[-1].step), st.p99_step_s, float(st.train_steps), st.data_share, float(st.windows_scanned))


def test_an_agent_sends_summaries_once_the_coordinator_gives_settings_and_the_coordinator_takes_them(tmp_path):
    journal = str(tmp_path / "j.jsonl")
    coord = Coordinator(Config(job="job", journal=journal), Journal(journal, lambda: (0.0, 0.0)))
    handler = ReportHandler(coord, "")
    agent = StepSummaries()
    for seq in range(1, 6):
        rep = agent.add(t.report("h", [t.rank(r, recent_steps=t.steps(4 * seq - 3, 4)) for r in (0, 1)], seq=seq))
        status, reply, _ = handler.handle({}, json.dumps(plain(rep)).encode(), float(seq))
        assert status == 200
        agent.accepted("job", json.loads(json.dumps(reply)))
    used = coord.registry.get_sample_value("watchdog_coordinator_step_summaries_total", {"outcome": "used"})
    assert used == 2 * 4  # reports 2-5 (the first reply gave the settings); none computed here
    assert coord.registry.get_sample_value("watchdog_coordinator_step_summaries_total", {"outcome": "computed"}) is None
    rv = coord.view.ranks[0].step_stats
    assert stats_of(rv) == stats_of(add_samples(StepStats(), t.steps(1, 20), DetectorConfig()))
    coord.journal.close()


# -- hostile summaries -----------------------------------------------------------------

GOOD = (41.0, 0.5, 8.0, 0.1, 7.0, 6.0, 20.0, 0.3, 0.4, 0.05, 7.0, 19.0, 0.3, 0.4, 0.0)


@pytest.mark.parametrize(
    "bad, message",
    [
        ([1.0, 2.0], "must hold 5 numbers and 5 per window"),
        ([*GOOD, 1.0], "must hold 5 numbers and 5 per window"),
        ("x", "must be a list of numbers"),
        (None, "must be a list of numbers"),
        ([*GOOD[:1], "0.5", *GOOD[2:]], "numbers only"),
        ([*GOOD[:1], True, *GOOD[2:]], "numbers only"),
        ([*GOOD[:1], -0.5, *GOOD[2:]], "durations and shares must be finite and >= 0"),
        ([*GOOD[:3], 1e300, *GOOD[4:]], "durations and shares must be finite and >= 0"),
        ([40.5, *GOOD[1:]], "whole numbers"),
        ([-1.0, *GOOD[1:]], "whole numbers"),
        ([*GOOD[:4], -2.0, *GOOD[5:]], "whole numbers"),
        ([float(1 << 60), *GOOD[1:]], "whole numbers"),
        ([*GOOD[:5], 8.0, *GOOD[6:]], "window indices must rise and be closed"),  # 8 after 7: past scanned
        ([*GOOD[:10], 5.0, *GOOD[11:]], "window indices must rise and be closed"),  # 6 then 5
        ([*GOOD[:5], *GOOD[5:10] * 17], "at most 16"),
    ],
)
@pytest.mark.parametrize("version", [1, 2])
def test_a_hostile_summary_costs_its_rank_only_with_a_clear_message(bad, message, version):
    good = plain(t.report("h", [t.rank(r, recent_steps=t.steps(1, 3), step_summary=GOOD) for r in (0, 1)]))
    good["step_summary_config"] = SETTINGS
    good["ranks"][1]["step_summary"] = bad
    body = as_rows(good) if version == 2 else good
    dropped: list = []
    rep = HostReport.from_dict(json.loads(json.dumps(body)), dropped)
    assert [r.rank for r in rep.ranks] == [0] and rep.ranks[0].step_summary == GOOD
    assert [(i, r) for i, r, _ in dropped] == [(1, 1)] and message in dropped[0][2], dropped


def test_nan_is_refused_where_json_cannot_carry_it():
    assert "finite" in stepsummary.problem((*GOOD[:1], float("nan"), *GOOD[2:]))
    assert "finite" in stepsummary.problem((*GOOD[:3], float("inf"), *GOOD[4:]))


@pytest.mark.parametrize("config", [[2, 256], "2/256", [2, 256, 50, 20, -4], [2, 256, 50, 20, 4.0], None])
def test_malformed_settings_in_a_report_refuse_it_with_a_clear_message(config):
    body = plain(t.report("h", [t.rank(0)]))
    body["step_summary_config"] = config
    with pytest.raises(ReportError, match="step_summary_config"):
        HostReport.from_dict(body, [])


def test_the_whole_report_check_agrees_with_the_per_rank_check():
    rng = random.Random(7)
    heads = [GOOD[:5], (0.0, 0.0, 0.0, 0.0, -1.0), GOOD]
    for _ in range(3000):
        summaries = [list(rng.choice(heads)) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.7:
            s = rng.choice(summaries)
            # hostile values among them: the checks must refuse a bool or a str where a number belongs
            s[rng.randrange(len(s))] = rng.choice((-2.0, -1.0, 0.5, 1e9, 1e300, float(1 << 53), 3, True, "1", 2.0))  # type: ignore[assignment]
        assert stepsummary.all_fine(summaries) == (not any(map(stepsummary.problem, summaries))), summaries


def test_the_agent_is_told_every_setting_the_statistics_depend_on():
    # A setting add_samples reads that the reply does not carry would make an agent's
    # statistics differ from the coordinator's under a non-default configuration.
    source = (Path(__file__).parents[1] / "watchdog/stepstats/steps.py").read_text()
    assert set(re.findall(r"\bcfg\.(\w+)", source)) == set(stepsummary.CONFIG_FIELDS)
