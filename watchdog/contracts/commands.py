"""Commands from the coordinator to an agent: the envelope, its signature, and the
checks an agent makes before it acts on one. Pure: the time and the ids already
seen are arguments.

Commands travel in the reply to a report (the coordinator never connects to an
agent). Envelope, one JSON object::

    {"id": "c-9f2c...", "job": "train-42", "type": "dump_stacks", "host": "node-a",
     "target": {"rank": 2, "pid": 4242, "proc_start_us": 1700000000123456} | null,
     "args": {...}, "issued_wall": 1700000000.25, "expires_wall": 1700000030.25,
     "sig": "<hex HMAC-SHA256>"}

``sig`` = HMAC-SHA256(signing key, DOMAIN + canonical JSON of every other field:
sorted keys, no whitespace, ASCII). The signing key is derived from the job token
(``jobtoken.signing_key``), apart from the bearer credential agents send with their
reports (``jobtoken.bearer``): whoever reads a report cannot sign a command. The
domain prefix keeps a command signature from being valid for anything else the
key might ever sign.

Times are in the *receiving agent's* wall clock: the coordinator takes
``issued_wall`` from the agent's own ``sent_wall`` in the report it answers, so a
host whose clock is off by a minute does not find every command expired.

Types (args):

- ``dump_stacks``    {"ranks": [Target, ...]}  Python stacks through py-spy
- ``snapshot_slots`` {"ranks": [Target, ...]}  slot header + ring; a dead rank's
  file is still readable. ``pid`` 0 in a Target = the rank's current slot.
- ``dump_flight_recorder`` {"ranks": [Target, ...]}  each rank's hook dumps its
  Flight Recorder next to its slot (control word DUMP_FLIGHT_RECORDER, background
  thread); the agent returns the entries (evidence.FlightRecorderDump).
- ``signal``         {"signal": "SIGTERM"}, ``target`` required: the agent
  re-checks the target's identity right before sending (pid reuse).
- ``checkpoint``     {"step": S, "ranks": [Target, ...]}: the agent writes
  CHECKPOINT_AT_STEP S into each rank's slot control block (identity checked);
  the hook's acknowledgement comes back in the reports (RankState.ctrl_ack_*).
- ``rollback``       {"before_step": S, "action": "a-3"}: the agent writes the job's
  rollback file in its run directory (``wire.rollback_filename``); a restarted
  script resumes from its newest checkpoint before step S
  (``watchdog.hook.rollback``). Sent before the restart's signals.

Without a job token. A destructive type (``signal``) is always refused. Evidence
types run unsigned only when *both* sides have no token, which they can only do
on loopback: the coordinator refuses to listen elsewhere without a token, and an
agent without a token accepts unsigned evidence commands only from a coordinator
URL on a loopback address (``loopback=True`` here).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import secrets
from collections.abc import Container
from typing import Any, TypeGuard

from watchdog import jobtoken

DOMAIN = b"rank-watchdog command v1\n"
DUMP_STACKS, SNAPSHOT_SLOTS, SIGNAL, CHECKPOINT = "dump_stacks", "snapshot_slots", "signal", "checkpoint"
ROLLBACK = "rollback"
DUMP_FLIGHT_RECORDER = "dump_flight_recorder"
TYPES = (DUMP_STACKS, SNAPSHOT_SLOTS, SIGNAL, CHECKPOINT, ROLLBACK, DUMP_FLIGHT_RECORDER)
EVIDENCE = frozenset({DUMP_STACKS, SNAPSHOT_SLOTS, DUMP_FLIGHT_RECORDER})
# Never run unsigned: a checkpoint request makes every rank pause and write.
DESTRUCTIVE = frozenset({SIGNAL, CHECKPOINT, ROLLBACK})
MAX_STEP = 1 << 62
SIGNALS = ("SIGTERM", "SIGINT", "SIGKILL", "SIGCONT", "SIGUSR1", "SIGUSR2")
FIELDS = ("id", "job", "type", "host", "target", "args", "issued_wall", "expires_wall", "sig")

# Why a command was not run. An API: the agent's refusal counter is labelled by these.
MALFORMED = "malformed"  # not an envelope, or args that do not fit the type
UNKNOWN_TYPE = "unknown_type"  # a newer coordinator, probably
UNSIGNED = "unsigned"  # this agent has a token and the command carries no signature
BAD_SIGNATURE = "bad_signature"  # forged, tampered with, or signed with another token
NO_TOKEN = "no_token"  # this agent has no token: destructive, or not from loopback
FOREIGN_JOB = "foreign_job"
WRONG_HOST = "wrong_host"
EXPIRED = "expired"
NOT_YET_VALID = "not_yet_valid"  # issued further in the future than clock skew explains
REPLAYED = "replayed"  # an id this agent has already seen
WRONG_IDENTITY = "wrong_identity"  # the target's pid is gone or now another process
UNKNOWN_TARGET = "unknown_target"  # signal: the pid is neither a rank of the job nor its launcher
REFUSALS = (
    MALFORMED,
    UNKNOWN_TYPE,
    UNSIGNED,
    BAD_SIGNATURE,
    NO_TOKEN,
    FOREIGN_JOB,
    WRONG_HOST,
    EXPIRED,
    NOT_YET_VALID,
    REPLAYED,
    WRONG_IDENTITY,
    UNKNOWN_TARGET,
)

MAX_TTL_S = 600.0  # a longer-lived command is refused: it bounds the replay cache and a leak's use
MAX_FUTURE_S = 60.0  # tolerated skew between issued_wall and the agent's clock
MAX_TARGETS = 256
MAX_ID_LEN = 64


def new_id() -> str:
    return "c-" + secrets.token_hex(8)


def make(
    *,
    job: str,
    type: str,
    host: str,
    args: dict[str, Any],
    issued_wall: float,
    ttl_s: float,
    target: dict[str, int] | None = None,
    id: str | None = None,
) -> dict[str, Any]:
    """An unsigned envelope (``sign`` adds ``sig``)."""
    return {
        "id": id or new_id(),
        "job": job,
        "type": type,
        "host": host,
        "target": target,
        "args": args,
        "issued_wall": round(issued_wall, 6),
        "expires_wall": round(issued_wall + ttl_s, 6),
        "sig": "",
    }


def target(rank: int, pid: int, proc_start_us: int) -> dict[str, int]:
    return {"rank": int(rank), "pid": int(pid), "proc_start_us": int(proc_start_us)}


def canonical(cmd: dict[str, Any]) -> bytes:
    body = {k: v for k, v in cmd.items() if k != "sig"}
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def signature(cmd: dict[str, Any], token: str) -> str:
    return hmac.new(jobtoken.signing_key(token), canonical(cmd), hashlib.sha256).hexdigest()


def sign(cmd: dict[str, Any], token: str) -> dict[str, Any]:
    """A copy of ``cmd`` with ``sig``; with no token, ``sig`` is "" (loopback only)."""
    out = {k: v for k, v in cmd.items() if k != "sig"}
    out["sig"] = signature(out, token) if token else ""
    return out


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve to anything: not loopback


def _is_time(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def valid_target(t: Any) -> TypeGuard[dict[str, Any]]:
    return (
        isinstance(t, dict)
        and all(_is_int(t.get(k)) for k in ("rank", "pid", "proc_start_us"))
        and t["pid"] >= 0
        and t["rank"] >= -1
    )


def _envelope_ok(cmd: Any) -> bool:
    if not isinstance(cmd, dict):
        return False
    for key in ("id", "job", "type", "host"):
        if not isinstance(cmd.get(key), str) or not cmd[key]:
            return False
    if len(cmd["id"]) > MAX_ID_LEN or not isinstance(cmd.get("args"), dict):
        return False
    if not isinstance(cmd.get("sig", ""), str) or (
        "target" in cmd and cmd["target"] is not None and not valid_target(cmd["target"])
    ):
        return False
    issued, expires = cmd.get("issued_wall"), cmd.get("expires_wall")
    return _is_time(issued) and _is_time(expires) and 0 <= expires - issued <= MAX_TTL_S


def _args_ok(cmd: dict[str, Any]) -> bool:
    args = cmd["args"]
    if cmd["type"] in EVIDENCE:
        ranks = args.get("ranks")
        return isinstance(ranks, list) and 0 < len(ranks) <= MAX_TARGETS and all(valid_target(t) for t in ranks)
    if cmd["type"] == SIGNAL:
        t = cmd.get("target")
        return args.get("signal") in SIGNALS and valid_target(t) and t["pid"] > 0
    if cmd["type"] == CHECKPOINT:
        ranks, step = args.get("ranks"), args.get("step")
        return (
            _is_int(step)
            and 0 <= step < MAX_STEP
            and isinstance(ranks, list)
            and 0 < len(ranks) <= MAX_TARGETS
            and all(valid_target(t) and t["pid"] > 0 for t in ranks)
        )
    if cmd["type"] == ROLLBACK:
        step, action = args.get("before_step"), args.get("action", "")
        return _is_int(step) and 0 < step < MAX_STEP and isinstance(action, str) and len(action) <= MAX_ID_LEN
    return False


def verify(
    cmd: Any,
    token: str,
    job: str,
    host: str,
    now_wall: float,
    seen_ids: Container[str],
    *,
    loopback: bool = False,
    not_before: float = 0.0,
) -> tuple[bool, str]:
    """(True, "") if the agent may run ``cmd``, else (False, reason in REFUSALS).

    ``token``: this agent's job token ("" = none). ``job``: the job whose report
    this reply answered. ``loopback``: the coordinator URL is a loopback address
    (only matters without a token). ``not_before``: when this agent started; a
    command issued earlier answers a report of an earlier agent process, so it is a
    replay (the ids seen live in memory and are gone after a restart). Target identity (pid reuse) is checked by the
    agent against the live process, right before acting: see ``identity_ok``."""
    if not _envelope_ok(cmd):
        return False, MALFORMED
    sig = cmd.get("sig") or ""
    try:
        expected = signature(cmd, token) if token else ""
    except (ValueError, TypeError, RecursionError):  # NaN, deep nesting: no canonical form, never signed by us
        return False, MALFORMED
    if token:
        if not sig:
            return False, UNSIGNED
        # compare_digest: the time taken must not tell a forger how much matched.
        if not hmac.compare_digest(sig.encode("ascii", "replace"), expected.encode("ascii")):
            return False, BAD_SIGNATURE
    if cmd["type"] not in TYPES:
        return False, UNKNOWN_TYPE
    if not token and (cmd["type"] in DESTRUCTIVE or not loopback):
        return False, NO_TOKEN
    if not _args_ok(cmd):
        return False, MALFORMED
    if cmd["job"] != job:
        return False, FOREIGN_JOB
    if cmd["host"] != host:
        return False, WRONG_HOST
    if cmd["issued_wall"] > now_wall + MAX_FUTURE_S:
        return False, NOT_YET_VALID
    if now_wall > cmd["expires_wall"]:
        return False, EXPIRED
    if cmd["id"] in seen_ids or cmd["issued_wall"] < not_before:
        return False, REPLAYED
    return True, ""


def identity_ok(t: dict[str, int], start_us_now: int | None, tolerance_us: int) -> tuple[bool, str]:
    """Is the process now at ``t["pid"]`` the one the command was issued for?
    ``start_us_now``: its start time as read just now, None if no such process."""
    if start_us_now is None:
        return False, f"pid {t['pid']} is gone"
    if abs(start_us_now - t["proc_start_us"]) > tolerance_us:
        return (
            False,
            f"pid {t['pid']} now belongs to another process (started {start_us_now}, expected {t['proc_start_us']})",
        )
    return True, ""


class ReplayCache:
    """Ids seen, each kept until its command has expired (a replay after that is
    refused as expired anyway), plus a margin for the clock stepping back.

    Bounded: when full, the entry closest to expiry goes first. Filling it takes
    many distinct validly signed commands, i.e. the token, whose holder could sign
    fresh commands anyway; and MAX_TTL_S bounds how long any entry is needed."""

    MARGIN_S = 120.0

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._expiry: dict[str, float] = {}

    def __contains__(self, cmd_id: object) -> bool:
        return cmd_id in self._expiry

    def __len__(self) -> int:
        return len(self._expiry)

    def add(self, cmd_id: str, expires_wall: float, now_wall: float) -> None:
        if len(self._expiry) >= self.capacity:
            horizon = now_wall - self.MARGIN_S
            self._expiry = {k: v for k, v in self._expiry.items() if v >= horizon}
            while len(self._expiry) >= self.capacity:
                del self._expiry[min(self._expiry, key=self._expiry.__getitem__)]
        self._expiry[cmd_id] = expires_wall
