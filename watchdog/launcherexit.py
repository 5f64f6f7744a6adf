"""The launcher's exit, told to the coordinator by ``watchdog run`` itself.

An agent can be silent (stopped, OOM-killed, cut off) when the job ends; then
nobody tells the coordinator, and a silent host means only "cannot see". The
launcher's wrapper can: ``watchdog run`` waits for the launcher and posts its
exit status here, directly (coordinator/analysis/silence.py weighs it). One message, one
schema, read and written by this module only:

    POST /api/v1/launcher-exit
    {"v": 1, "job": "...", "host": "...", "pid": 4242, "status": 1}

``status``: the exit code (0-255), or minus the signal that killed it.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from watchdog import jobtoken

PATH = "/api/v1/launcher-exit"
VERSION = 1
MAX_NAME = 256  # job and host names, as in reports


@dataclass(frozen=True)
class Exit:
    job: str
    host: str
    pid: int
    status: int

    def to_json(self) -> bytes:
        d = {"v": VERSION, "job": self.job, "host": self.host, "pid": self.pid, "status": self.status}
        return json.dumps(d, separators=(",", ":")).encode()


def parse(obj: Any) -> Exit:
    """The message in a decoded JSON body; ValueError naming what is wrong."""
    if not isinstance(obj, Mapping):
        raise ValueError("launcher exit must be a JSON object")
    if obj.get("v") != VERSION or type(obj.get("v")) is not int:
        raise ValueError(f"unsupported launcher exit version {obj.get('v')!r}; this coordinator reads {VERSION}")
    for key in ("job", "host"):
        val = obj.get(key)
        if not isinstance(val, str) or not 0 < len(val) <= MAX_NAME:
            raise ValueError(f"{key} must be a string of 1..{MAX_NAME} characters")
    pid, status = obj.get("pid"), obj.get("status")
    if type(pid) is not int or not 0 < pid < 1 << 31:
        raise ValueError("pid must be a positive integer")
    if type(status) is not int or not -128 < status <= 255:
        raise ValueError("status must be an exit code (0..255) or minus a signal number")
    return Exit(job=obj["job"], host=obj["host"], pid=pid, status=status)


def send(url: str, token: str, ex: Exit, timeout_s: float = 3.0) -> None:
    """POST ``ex`` to the coordinator at ``url``; raises OSError (URLError) on failure."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {jobtoken.bearer(token)}"
    req = urllib.request.Request(url.rstrip("/") + PATH, data=ex.to_json(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()
