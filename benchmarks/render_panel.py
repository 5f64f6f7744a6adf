"""Renders two panels of the "rank-watchdog / job" dashboard from real data into
docs/img/job-overview-panels.png, without a Grafana server (none can run here):

  a real torchrun job (4 gloo ranks on CPU, rank 1's compute 1.5x slower) with the
  hook, a real agent, a real Prometheus scraping it every second; then the
  dashboard's own PromQL (taken from grafana/generate.py, variables substituted)
  is run through Prometheus' HTTP range-query API and plotted with matplotlib.

    .venv/bin/pip install matplotlib
    .venv/bin/python benchmarks/render_panel.py [--seconds 90] [--out docs/img/job-overview-panels.png]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from promserver import Prometheus  # noqa: E402

from watchdog.dev import localjob  # noqa: E402

HEATMAP = "Straggler heatmap: compute vs job mean, the 10 slowest ranks"
RATE_WINDOW = "10s"  # what $__rate_interval is with a 1 s scrape and a ~2 s query step


def generator():
    spec = importlib.util.spec_from_file_location("grafana_generate", REPO / "grafana" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def panel_expr(dashboard: dict, title: str, job: str) -> str:
    p = next(p for p in dashboard["panels"] if p["title"] == title)
    return (
        p["targets"][0]["expr"]
        .replace("$__rate_interval", RATE_WINDOW)
        .replace('"$training_job"', f'"{job}"')
        .replace('"$host"', '".*"')
    )


def query_range(prom: Prometheus, expr: str, start: float, end: float, step: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom.url}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def collect(seconds: float, work: Path) -> tuple[dict, dict, float, float]:
    job = "render-demo"
    run_dir = work / "run"
    run_dir.mkdir()
    agent = localjob.start_agent(
        work, run_dir, job, extra=["--poll.interval-seconds", "0.1", "--collector.accelerator", "false"]
    )
    prom = Prometheus(work, [agent.address])
    cfg = yaml.safe_load((REPO / "deploy" / "prometheus" / "scrape" / "static.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg.pop("alerting")
    # The panels divide by and read the recording rules (1m rates: plot from start + 30 s on).
    cfg["rule_files"] = [str(p) for p in sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.rules.yml"))]
    cfg["scrape_configs"] = [cfg["scrape_configs"][0]]  # the agent job
    cfg["scrape_configs"][0]["static_configs"][0]["targets"] = [agent.address]
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    prom.start()
    torchrun = localjob.TorchrunJob(
        nproc=4,
        run_dir=run_dir,
        job=job,
        work_dir=work,
        script_args=["--steps", "100000", "--compute-ms", "40", "--jitter", "0.1", "--fault", "slow:1:1.5"],
    ).start()
    try:
        torchrun.wait_for_ranks(120)
        start = time.time()  # plotted from start + 30 s: the first steps (warm-up) dwarf the rest
        time.sleep(seconds)
        end = time.time()
        dash = generator().job_dashboard()
        split = query_range(prom, panel_expr(dash, "Where step time goes", job), start + 30, end, 2)
        heat = query_range(prom, panel_expr(dash, HEATMAP, job), start + 30, end, 2)
        return {"split": split, "heat": heat}, dash, start, end
    finally:
        torchrun.stop()
        prom.stop()
        agent.stop()


def plot(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.2), dpi=110)
    fig.patch.set_facecolor("#181b1f")
    for ax in (ax1, ax2):
        ax.set_facecolor("#181b1f")
        ax.tick_params(colors="#ccccdc", labelsize=8)
        for s in ax.spines.values():
            s.set_color("#444")
    t0 = min(float(v[0]) for s in data["split"] + data["heat"] for v in s["values"])

    order = {"data": 0, "collective": 1, "compute": 2}
    colors = {"data": "#f2cc0c", "collective": "#5794f2", "compute": "#73bf69"}
    series = sorted(data["split"], key=lambda s: order[s["metric"]["part"]])
    ts = np.array([float(v[0]) - t0 for v in series[0]["values"]])
    ys = [np.array([float(v[1]) * 1000 for v in s["values"]]) for s in series]
    ax1.stackplot(
        ts,
        *ys,
        labels=[s["metric"]["part"] for s in series],
        colors=[colors[s["metric"]["part"]] for s in series],
        alpha=0.85,
    )
    ax1.set_title("Where step time goes (ms per step, all ranks)", color="#ccccdc", fontsize=10, loc="left")
    ax1.set_xlabel("seconds", color="#ccccdc", fontsize=8)
    ax1.legend(loc="upper right", fontsize=8, facecolor="#222", labelcolor="#ccccdc", edgecolor="#444")

    heat = sorted(data["heat"], key=lambda s: int(s["metric"]["rank"]))
    grid = np.array([[float(v[1]) for v in s["values"]] for s in heat])
    ht = [float(v[0]) - t0 for v in heat[0]["values"]]
    im = ax2.imshow(
        grid,
        aspect="auto",
        cmap="RdYlGn_r",
        vmin=0.8,
        vmax=1.5,
        interpolation="nearest",
        extent=(ht[0], ht[-1], len(heat) - 0.5, -0.5),
    )
    ax2.set_yticks(range(len(heat)), [f"rank {s['metric']['rank']}" for s in heat])
    ax2.set_title(HEATMAP, color="#ccccdc", fontsize=10, loc="left")
    ax2.set_xlabel("seconds", color="#ccccdc", fontsize=8)
    cb = fig.colorbar(im, ax=ax2, fraction=0.04)
    cb.ax.tick_params(colors="#ccccdc", labelsize=8)
    fig.text(
        0.01,
        0.005,
        "Rendered with matplotlib from Prometheus range queries of the dashboard's PromQL over a "
        "real 4-rank CPU torchrun job (rank 1: --fault slow:1:1.5). Not a Grafana screenshot.",
        color="#8e8e8e",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=fig.get_facecolor())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "job-overview-panels.png")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data, _, start, end = collect(args.seconds, Path(tmp))
    ratios = {s["metric"]["rank"]: [float(v[1]) for v in s["values"]] for s in data["heat"]}
    for rank, vals in sorted(ratios.items()):
        print(f"rank {rank}: compute vs median mean {sum(vals) / len(vals):.2f} over {len(vals)} points")
    plot(data, args.out)
    print(f"wrote {args.out} ({end - start:.0f} s of data)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
