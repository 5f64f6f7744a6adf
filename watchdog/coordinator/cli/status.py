"""``watchdog status``: a live per-rank table from a coordinator's status API.

watchdog status --coordinator.url http://127.0.0.1:19401 [--watch] [--json]
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO

from ... import flags, jobtoken
from ..intake.server import STATUS_PATH
from ..performance.verdict import split_line

FLAGS = (
    flags.Flag("coordinator.url", "http://127.0.0.1:19401", "coordinator base URL (a bare HOST:PORT works too)"),
    jobtoken.inline_flag("job token, when the coordinator has one"),
    jobtoken.file_flag("file holding the job token"),
    flags.Flag("watch.interval-seconds", 1.0, "refresh period with --watch", flags.positive_float),
    flags.Flag("timeout-seconds", 5.0, "HTTP timeout", flags.positive_float),
    flags.Flag("coordinator.ca-file", "", "CA certificate(s) of an https coordinator (default: the system's)"),
)
DESCRIPTION = "Print a per-rank table (step, phase, step time split, heartbeat, findings) from a coordinator."
# Switches (no value), beside the flags: (name, what it does).
SWITCHES = (("watch", "refresh until Ctrl-C"), ("json", "print the raw document"))


def fetch(url: str, token: str, timeout: float, ca_file: str = "") -> dict[str, Any]:
    if "://" not in url:
        url = "http://" + url
    req = urllib.request.Request(url.rstrip("/") + STATUS_PATH)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = ssl.create_default_context(cafile=ca_file or None) if url.startswith("https:") else None
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
        return json.load(resp)


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def render(doc: dict[str, Any]) -> str:
    lost = [h["host"] for h in doc.get("hosts", []) if h.get("lost")]
    unseen = [h["host"] for h in doc.get("hosts", []) if h.get("unobserved")]
    head = (
        f"job {doc.get('job') or '?'}: {doc.get('registered', 0)}/{doc.get('world_size', 0)} ranks registered, "
        f"{len(doc.get('hosts', []))} hosts"
        + (f" ({len(lost)} lost: {', '.join(lost)})" if lost else "")
        + (f" ({len(unseen)} unobserved, its agent silent: {', '.join(unseen)})" if unseen else "")
    )
    cols = ("RANK", "HOST", "HEALTH", "STEP", "PHASE", "STEP_MS", "DATA_MS", "COMP_MS", "COLL_MS", "HB_AGE", "FINDINGS")
    rows = [cols]
    gpu_rows = 0
    for r in doc.get("ranks", []):
        if r.get("health") == "missing":
            rows.append(
                (str(r["rank"]), "-", "missing", "-", "-", "-", "-", "-", "-", "-", ",".join(r.get("findings", [])))
            )
            continue
        # Where the accelerator's clock split the step, its figures (marked "g"):
        # on NCCL the CPU side's collective wait reads ~0.
        src, mark = (r["gpu"], "g") if isinstance(r.get("gpu"), dict) else (r, "")
        gpu_rows += bool(mark)
        phase = r.get("phase", "")
        if r.get("in_data_wait"):
            phase += "/data"
        elif r.get("coll", {}).get("outstanding"):
            phase += f"/{r['coll']['op']}#{r['coll']['seq']}"
        rows.append(
            (
                str(r["rank"]),
                r.get("host", ""),
                r.get("health", ""),
                str(r.get("step", "")),
                phase,
                _ms(src.get("step_s")) + mark,
                _ms(src.get("data_s")) + mark,
                _ms(src.get("compute_s")) + mark,
                _ms(src.get("coll_s")) + mark,
                f"{r.get('heartbeat_age_s', 0):.1f}s",
                ",".join(r.get("findings", [])) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = [head, ""] + ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if gpu_rows:
        lines.append("(g: on the accelerator's clock: step between GPU step ends, GPU-side collective wait)")
    b, g = doc.get("bottleneck"), doc.get("goodput")
    if b or g:
        lines.append("")
    if b:
        lines.append(f"bottleneck: {b.get('reason', b.get('verdict', '?'))}")
        split = split_line(b.get("evidence") or {})
        if split:
            lines.append(split)
    if g and g.get("summary"):
        lines.append(f"time: {g['summary']}")
    findings = doc.get("findings", [])
    if findings:
        lines += ["", f"active findings ({len(findings)}):"]
        for f in findings:
            lines.append(f"  [{f['kind']}] {f['reason']} (for {f.get('since_s', 0):.1f} s)")
            if f.get("stacks"):
                lines.append(f"    stacks: {f['stacks']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    switches = argparse.ArgumentParser(add_help=False)
    for name, _ in SWITCHES:
        switches.add_argument(f"--{name}", action="store_true")
    known, rest = switches.parse_known_args(argv)
    try:
        values = flags.parse(
            "watchdog status",
            DESCRIPTION + " Switches: " + ", ".join(f"--{name} ({what})" for name, what in SWITCHES) + ".",
            FLAGS,
            rest,
        )
        token = jobtoken.read(values)
    except flags.FlagError as exc:
        print(f"watchdog status: {exc}", file=sys.stderr)
        return 2
    try:
        return _loop(values, token, known.watch, known.json, out)
    except KeyboardInterrupt:
        return 0


def _loop(values: dict[str, Any], token: str, watch: bool, as_json: bool, out: TextIO) -> int:
    url, timeout = values["coordinator_url"], values["timeout_seconds"]
    while True:
        try:
            doc = fetch(url, token, timeout, values["coordinator_ca_file"])
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            print(f"watchdog status: {url}: HTTP {exc.code} {detail}", file=sys.stderr)
            return 1
        except (urllib.error.URLError, OSError, ValueError) as exc:
            print(f"watchdog status: cannot reach {url}: {exc}", file=sys.stderr)
            if not watch:
                return 1
            doc = None
        if doc is not None:
            text = json.dumps(doc, indent=2) if as_json else render(doc)
            if watch and not as_json and out.isatty():
                out.write("\x1b[H\x1b[2J")  # redraw in place
            print(text, file=out, flush=True)
        if not watch:
            return 0
        time.sleep(values["watch_interval_seconds"])
