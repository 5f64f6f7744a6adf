"""Instant queries against a Prometheus HTTP API, for the read-side CLIs
(``watchdog hosts``, ``watchdog scaling --prometheus``). Standard library only."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class PromError(Exception):
    """Prometheus could not be asked, or answered something else than a vector."""


def query(base: str, expr: str, timeout: float, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's samples: [{"metric": {...}, "value": float}]; ``at``:
    the evaluation time (epoch seconds), default now."""
    if "://" not in base:
        base = "http://" + base
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            doc = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise PromError(f"{base}: HTTP {exc.code} {exc.read().decode('utf-8', 'replace')[:300]}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PromError(f"cannot query {base}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success" or doc.get("data", {}).get("resultType") != "vector":
        raise PromError(f"{base}: unexpected answer to {expr!r}: {str(doc)[:300]}")
    try:
        return [{"metric": s["metric"], "value": float(s["value"][1])} for s in doc["data"]["result"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise PromError(f"{base}: malformed sample in the answer to {expr!r}: {exc}") from None
