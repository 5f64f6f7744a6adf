"""The scale benchmark's side of one report exchange: a POST on a kept-alive
connection and the coordinator's reply, read as the agent reads it. Shared by
the live generator (``scale.py``) and the replay (``scalereplay.py``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

try:  # the generator's own CPU is what limits it at 16,384 ranks: orjson ~10x cheaper than json here
    import orjson
except ImportError:  # pragma: no cover - a dependency of the coordinator
    orjson = None  # type: ignore[assignment]

REPORT_PATH = "/api/v1/report"


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj) if orjson is not None else json.dumps(obj, separators=(",", ":")).encode()


def loads(raw: bytes) -> Any:
    return orjson.loads(raw) if orjson is not None else json.loads(raw)


def request(host: str, body: bytes) -> bytes:
    """The whole HTTP request carrying ``body`` to ``host``."""
    head = f"POST {REPORT_PATH} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


class Link:
    """One kept-alive connection to the coordinator, as an agent keeps it:
    opened again after a reply other than 200 (the coordinator closes then)."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(*self.addr)

    async def post(self, body: bytes) -> tuple[bool, Any, float]:
        """(answered 200, the reply, seconds from sending to the reply read)."""
        assert self.reader is not None and self.writer is not None
        t1 = time.perf_counter()
        ok, reply = await exchange(self.reader, self.writer, request(self.addr[0], body))
        lat = time.perf_counter() - t1
        if not ok:
            self.writer.close()
            await self.open()
        return ok, reply, lat

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> tuple[bool, Any]:
    """Send ``req``; (whether the coordinator answered 200, its reply decoded or {})."""
    writer.write(req)
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode().partition(":")
        if k.lower() == "content-length":
            length = int(v)
    reply = loads(await reader.readexactly(length)) if length else {}
    return status_line.startswith(b"HTTP/1.1 200"), reply


def asked_interval(reply: Any, interval: float) -> float:
    """The report interval the reply asks for (back-pressure), never below the agent's own."""
    asked = reply.get("report_interval_s") if isinstance(reply, dict) else None
    return max(interval, float(asked)) if isinstance(asked, (int, float)) else interval
