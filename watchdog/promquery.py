"""Instant queries against a Prometheus HTTP API, for the read-side CLIs
(``watchdog hosts``, ``watchdog scaling --prometheus``). Standard library only.

A Prometheus behind auth (a gateway, Mimir, Thanos, Cortex): a bearer token read
from a file (``--prometheus.bearer-token-file``), a CA for its certificate
(``--prometheus.ca-file``), and a tenant sent as ``X-Scope-OrgID``
(``--prometheus.tenant``)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from watchdog.flags import Flag, dest_of

TENANT_HEADER = "X-Scope-OrgID"
TOKEN_FILE, CA_FILE, TENANT = "prometheus.bearer-token-file", "prometheus.ca-file", "prometheus.tenant"
FLAGS = (
    Flag(TOKEN_FILE, "", "file holding a bearer token for Prometheus (sent as Authorization: Bearer)"),
    Flag(CA_FILE, "", "CA certificate(s) of an https Prometheus (default: the system's)"),
    Flag(TENANT, "", f"tenant id sent as {TENANT_HEADER} (Mimir, Cortex, Thanos receive)"),
)


class PromError(Exception):
    """Prometheus could not be asked, or answered something else than a vector."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to ask; reads as its URL in messages."""

    url: str
    bearer_token: str = ""
    ca_file: str = ""
    tenant: str = ""

    def __str__(self) -> str:
        return self.url

    def headers(self) -> dict[str, str]:
        out = {}
        if self.bearer_token:
            out["Authorization"] = f"Bearer {self.bearer_token}"
        if self.tenant:
            out[TENANT_HEADER] = self.tenant
        return out


def endpoint(url: str, values: Mapping[str, Any]) -> Endpoint:
    """An Endpoint from the ``FLAGS`` values (``flags.parse`` or argparse, same dests);
    an unreadable or empty token file is a PromError naming it."""
    path = values.get(dest_of(TOKEN_FILE)) or ""
    token = ""
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise PromError(f"--{TOKEN_FILE}={path}: {getattr(exc, 'strerror', None) or exc}") from None
        if not token:
            raise PromError(f"--{TOKEN_FILE}={path}: the file holds no token")
    return Endpoint(url, token, values.get(dest_of(CA_FILE)) or "", values.get(dest_of(TENANT)) or "")


def query(base: str | Endpoint, expr: str, timeout: float, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query's samples: [{"metric": {...}, "value": float}]; ``at``:
    the evaluation time (epoch seconds), default now."""
    ep = base if isinstance(base, Endpoint) else Endpoint(base)
    base = ep.url if "://" in ep.url else "http://" + ep.url
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    try:
        ctx = ssl.create_default_context(cafile=ep.ca_file or None) if base.startswith("https:") else None
        req = urllib.request.Request(url, headers=ep.headers())
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            doc = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise PromError(f"{base}: HTTP {exc.code} {exc.read().decode('utf-8', 'replace')[:300]}") from None
    except (urllib.error.URLError, OSError, ValueError, ssl.SSLError) as exc:
        raise PromError(f"cannot query {base}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success" or doc.get("data", {}).get("resultType") != "vector":
        raise PromError(f"{base}: unexpected answer to {expr!r}: {str(doc)[:300]}")
    try:
        return [{"metric": s["metric"], "value": float(s["value"][1])} for s in doc["data"]["result"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise PromError(f"{base}: malformed sample in the answer to {expr!r}: {exc}") from None
