"""Headless Chromium for the report tests: screenshot, DOM after scripts, console
errors, network requests. One process per call (~2 s); flags keep it away from
the user's profile, and a dead proxy keeps it (and the page) off the network.
Whether the page tried to fetch anything is read from Chromium's NetLog: the
browser's own background requests are there too, the page's are the ones made
for a file:// site."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--proxy-server=http://127.0.0.1:9",
    "--enable-logging=stderr",
    "--v=0",
]


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium")
    with tempfile.TemporaryDirectory(prefix="wd-chromium-") as profile:
        return subprocess.run(
            [exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout
        )


def screenshot(
    page: Path,
    png: Path,
    size: tuple[int, int] = (1400, 900),
    fragment: str = "",
    timeout: float = 90,
    netlog: Path | None = None,
) -> str:
    """Render ``page`` and write ``png``; returns chromium's log (stderr)."""
    extra = [f"--log-net-log={netlog}"] if netlog else []
    proc = _run(
        [*extra, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", page.resolve().as_uri() + fragment],
        timeout,
    )
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stderr


def dump_dom(page: Path, fragment: str = "", timeout: float = 90) -> tuple[str, str]:
    """The DOM after the page's scripts ran, and chromium's log."""
    proc = _run(["--dump-dom", page.resolve().as_uri() + fragment], timeout)
    return proc.stdout, proc.stderr


def console_messages(log: str) -> list[str]:
    """Anything the page wrote to its console (uncaught errors, failed loads,
    console.*): the report writes nothing there, so every line is a problem."""
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked the network for (NetLog requests of a file:// site)."""
    urls = set()
    for e in json.loads(netlog.read_text()).get("events", []):
        p = e.get("params") or {}
        url = p.get("url", "")
        if url.startswith(("http:", "https:", "ws:", "wss:")) and (
            str(p.get("network_isolation_key", "")).startswith("file://")
            or "site=file://" in str(p.get("site_for_cookies", ""))
        ):
            urls.add(url)
    return sorted(urls)
