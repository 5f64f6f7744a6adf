"""The agent's exposition: golden names/HELP, series per rank, promtool lint,
collector isolation. Built through the real Agent wiring with real slot files
(written by this process, so the ranks are alive) and a fake pynvml."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from watchdog.agent import config, testing
from watchdog.agent.export import metrics as m
from watchdog.agent.export.exporter import Exporter
from watchdog.agent.export.nvml import Accelerators
from watchdog.agent.main import Agent
from watchdog.contracts import slot as wire

GOLDEN = Path(__file__).parent / "golden" / "agent_metrics.txt"
REGEN = "WATCHDOG_REGEN_GOLDEN=1 python -m pytest tests/test_agent_metrics.py -k golden"
MS = 1_000_000

GPU = {
    "name": "Fake H100",
    "uuid": "GPU-0000",
    "util": 87,
    "mem_util": 40,
    "mem_used": 30 << 30,
    "mem_total": 80 << 30,
    "temp": 61,
    "power_mw": 350_000,
    "sm_mhz": 1980,
    "throttle": 0,
    "pids": [],
}


@pytest.fixture
def exposition(tmp_path):
    writers = [testing.RankSlot(str(tmp_path), testing.identity("train", r, 2), name=f"r{r}.slot") for r in (0, 1)]
    for wr in writers:
        wr.step(400 * MS, 50 * MS, 150 * MS)
        wr.step(300 * MS, 20 * MS, 100 * MS)
        wr.enter_collective(3)
    cfg = config.AgentConfig(run_dir=str(tmp_path), listen=("127.0.0.1", 0), host="h1")
    agent = Agent(cfg, accelerators=Accelerators(testing.FakeNvml([GPU], xid={0: [79]})))
    agent.poll_once()
    text = generate_latest(agent.registry).decode()
    yield text
    for wr in writers:
        wr.close()


def help_type_lines(text):
    return [line for line in text.splitlines() if line.startswith(("# HELP ", "# TYPE "))]


def test_golden_names_types_and_help(exposition):
    lines = help_type_lines(exposition)
    if os.environ.get("WATCHDOG_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(lines) + "\n")
    golden = GOLDEN.read_text().splitlines()
    assert lines == golden, (
        f"the agent's metric names/HELP/TYPE changed; metric names are an API. If intended, regenerate with:\n"
        f"    {REGEN}\nand review the diff of {GOLDEN.relative_to(Path(__file__).parent.parent)}"
    )


def test_every_family_is_namespaced_and_defined_in_metrics_module(exposition):
    names = {f.name for f in text_string_to_metric_families(exposition)}
    specs = {v.name.removesuffix("_total") for v in vars(m).values() if isinstance(v, m.Spec)}
    assert names == specs
    assert all(n.startswith("watchdog_") for n in names)


def per_rank_samples(text, job="train", rank="0"):
    return [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("training_job") == job and s.labels.get("rank") == rank and "local_rank" in s.labels
    ]


def test_no_series_carries_prometheus_target_labels(exposition):
    """`job` and `instance` are Prometheus' own target labels: a scraped `job` is renamed
    exported_job, or with honor_labels overwrites the scrape job on some series only.
    The training job is `training_job` on every per-rank and per-job series."""
    samples = [s for f in text_string_to_metric_families(exposition) for s in f.samples]
    assert samples
    for s in samples:
        assert not {"job", "instance", "exported_job"} & set(s.labels), s
        if s.name.startswith(("watchdog_rank_", "watchdog_job_")):
            assert s.labels.get("training_job") == "train", s


def test_series_per_rank_is_the_documented_count(exposition):
    samples = per_rank_samples(exposition)
    assert len(samples) == m.SERIES_PER_RANK == 30 <= 30
    assert f"exactly {m.SERIES_PER_RANK} of them per rank" in m.__doc__
    assert all(set(m.RANK_LABELS) <= set(s.labels) for s in samples)
    assert {s.labels["host"] for s in samples} == {"h1"}


def test_step_parts_add_up_to_the_step(exposition):
    by: dict[str, dict[str | None, float]] = {}
    for s in per_rank_samples(exposition):
        by.setdefault(s.name, {})[s.labels.get("part")] = s.value
    last = by["watchdog_rank_last_step_part_seconds"]
    assert last == pytest.approx({"data": 0.02, "collective": 0.1, "compute": 0.18})
    assert sum(last.values()) == pytest.approx(by["watchdog_rank_last_step_seconds"][None])
    total = by["watchdog_rank_step_part_seconds_total"]
    assert sum(total.values()) == pytest.approx(0.7)
    assert by["watchdog_rank_window_step_seconds"][None] == pytest.approx(0.35)
    assert by["watchdog_rank_in_collective"][None] == 1.0
    assert by["watchdog_rank_collective_seq"][None] == 3.0
    assert by["watchdog_rank_steps_total"][None] == 2.0
    assert by["watchdog_rank_alive"][None] == 1.0


def test_accelerator_series_from_fake_nvml(exposition):
    fams = {f.name: f for f in text_string_to_metric_families(exposition)}
    value = lambda name: fams[name].samples[0].value  # noqa: E731
    assert value("watchdog_accelerator_available") == 1.0
    assert value("watchdog_accelerator_utilization_ratio") == pytest.approx(0.87)
    assert value("watchdog_accelerator_power_watts") == 350.0
    assert value("watchdog_accelerator_sm_clock_hertz") == 1.98e9
    assert value("watchdog_accelerator_xid_errors") == 1.0


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed (Debian package 'prometheus')")
def test_promtool_check_metrics(exposition):
    res = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


# -- exporter isolation -------------------------------------------------------------


class Boom:
    name = "boom"

    def collect(self):
        raise RuntimeError("kaput")


class Fine:
    name = "fine"

    def collect(self):
        fam = m.POLLS.family()
        fam.add_metric([], 3)
        return [fam]


class Log:
    def __init__(self):
        self.events = []

    def __getattr__(self, level):
        return lambda event, **kw: self.events.append((level, event))


def test_a_raising_collector_does_not_take_the_others_down():
    log = Log()
    reg = CollectorRegistry()
    ticks = iter(range(100))
    reg.register(Exporter([Boom(), Fine()], log=log, timer=lambda: next(ticks) * 0.5))
    for _ in range(2):
        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert fams["watchdog_agent_polls"].samples[0].value == 3
    success = {s.labels["collector"]: s.value for s in fams["watchdog_collector_success"].samples}
    assert success == {"boom": 0.0, "fine": 1.0}
    duration = {s.labels["collector"]: s.value for s in fams["watchdog_collector_duration_seconds"].samples}
    assert duration == {"boom": 0.5, "fine": 0.5}
    assert log.events == [("error", "collector failed")]  # once, not per scrape


def test_collector_names_must_be_unique():
    with pytest.raises(ValueError):
        Exporter([Fine(), Fine()])


def test_specs_are_well_formed():
    for spec in (v for v in vars(m).values() if isinstance(v, m.Spec)):
        assert spec.name.startswith("watchdog_")
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
    assert len(wire.Phase) == len(m.PHASES)


def test_report_accelerators_name_the_ranks_on_each_device(tmp_path):
    wr = testing.RankSlot(str(tmp_path), testing.identity("train", 3, 4))
    gpu = dict(GPU, pids=[os.getpid(), 99999999])
    cfg = config.AgentConfig(run_dir=str(tmp_path), listen=("127.0.0.1", 0), host="h1")
    agent = Agent(cfg, accelerators=Accelerators(testing.FakeNvml([gpu])))
    agent.poll_once()
    (d,) = agent.accelerator_dicts()
    assert d["ranks"] == [3] and d["name"] == "Fake H100"
    wr.close()


def _scrape_once(tmp_path, *slots) -> str:
    """One poll of a real agent over ``tmp_path`` (no accelerator), its exposition;
    the slots are closed after."""
    cfg = config.AgentConfig(run_dir=str(tmp_path), listen=("127.0.0.1", 0), host="h1")
    agent = Agent(cfg, accelerators=Accelerators(testing.FakeNvml([])))
    agent.poll_once()
    text = generate_latest(agent.registry).decode()
    for slot in slots:
        slot.close()
    return text


def test_bytes_batch_and_finer_split_are_exported_where_measured(tmp_path):
    measured = testing.RankSlot(str(tmp_path), testing.identity("train", 0, 2), name="r0.slot")
    plain = testing.RankSlot(str(tmp_path), testing.identity("train", 1, 2), name="r1.slot")
    for _ in range(2):
        measured.step(400 * MS, 50 * MS, 150 * MS, coll_bytes=3 << 20, split=(60 * MS, 120 * MS, 20 * MS, 0))
        plain.step(400 * MS, 50 * MS, 150 * MS)
    measured.batch(32)
    text = _scrape_once(tmp_path, measured, plain)
    got = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name.startswith(("watchdog_rank_collective_bytes", "watchdog_rank_batch", "watchdog_rank_model_part")):
                got[(s.name, s.labels["rank"], s.labels.get("part"))] = s.value
    assert got == {
        ("watchdog_rank_collective_bytes_total", "0", None): 6 << 20,
        ("watchdog_rank_collective_bytes_total", "1", None): 0,
        ("watchdog_rank_batch_size", "0", None): 32,
        ("watchdog_rank_model_part_seconds_total", "0", "forward"): pytest.approx(0.12),
        ("watchdog_rank_model_part_seconds_total", "0", "backward"): pytest.approx(0.24),
        ("watchdog_rank_model_part_seconds_total", "0", "optimizer"): pytest.approx(0.04),
    }  # no h2d (never measured), nothing optional for the plain rank


def test_the_gpu_clock_split_is_exported_with_its_clock_only_where_a_completion_source_runs(tmp_path):
    from watchdog.agent.slotfiles.gpusteps import COLLECTIVE, STEP

    gpu = int(wire.Clock.GPU_EVENT)
    measured = testing.RankSlot(str(tmp_path), testing.identity("train", 0, 2), name="r0.slot")
    plain = testing.RankSlot(str(tmp_path), testing.identity("train", 1, 2), name="r1.slot")
    t0 = measured.words[wire.H_HEARTBEAT_NS]
    measured.step(10 * MS, 2 * MS, MS // 20, now_ns=t0)
    measured.event(wire.RecordKind.COMPLETION, t0, 1, STEP, 0, 1, t0, t0, gpu, 0)
    measured.step(10 * MS, 2 * MS, MS // 20, now_ns=t0 + 10 * MS)
    measured.event(wire.RecordKind.COMPLETION, t0, 1, COLLECTIVE, 0, 1, t0, t0 + 140 * MS, gpu, t0 + 100 * MS)
    measured.event(wire.RecordKind.COMPLETION, t0, 2, STEP, 0, 2, t0 + 10 * MS, t0 + 141 * MS, gpu, 0)
    plain.step(400 * MS, 50 * MS, 150 * MS)
    text = _scrape_once(tmp_path, measured, plain)
    got = {
        (s.labels["rank"], s.labels["clock"], s.labels["part"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "watchdog_rank_gpu_step_part_seconds_total"
    }
    assert got == {
        ("0", "gpu", "data"): pytest.approx(0.002),
        ("0", "gpu", "collective"): pytest.approx(0.040),
        ("0", "gpu", "compute"): pytest.approx(0.099),
    }
