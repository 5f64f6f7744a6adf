"""The agent -> hook control block in the slot: a request, its validation, the acknowledgement codes.

The agent writes H_CTRL_CMD and H_CTRL_ARG, then bumps H_CTRL_SEQ
(``wire.write_control``). Anyone can scribble on a slot file, so everything read
here is validated; a request the hook does not understand is rejected
(acknowledged with ACK_REJECTED), never acted on and never raised. A new
sequence number supersedes a pending request: the block holds one command, so
the previous one is gone anyway.

Acknowledgement (the hook's, ``watchdog.hook.slot.control_block.ControlBlock.ack``):
H_CTRL_ACK_RESULT, _STEP and _NS first, H_CTRL_ACK_SEQ last, with one of the
ACK_* result codes below, which the agent reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from watchdog.contracts.slot import H_CTRL_ARG, H_CTRL_CMD, H_CTRL_SEQ, Command

ACK_OK = 0
ACK_SAVE_FAILED = -1  # the registered checkpoint function raised
ACK_REJECTED = -2  # unknown command or argument out of range
ACK_NO_HANDLER = -3  # CHECKPOINT_AT_STEP but no function registered; DUMP_FLIGHT_RECORDER without FR

MAX_STEP_ARG = 1 << 62


@dataclass(frozen=True)
class ControlRequest:
    """One command read from the slot's control block (agent -> hook)."""

    seq: int
    command: int
    arg: int


class Words(Protocol):
    """What ``read_request`` reads: int64 words by index (the slot's, or any table of them)."""

    def __getitem__(self, index: int, /) -> int: ...


def read_request(words: Words, last_seen: int) -> ControlRequest | None:
    """A new request, or None. ``words`` is the slot as int64 words."""
    seq = words[H_CTRL_SEQ]
    if seq == last_seen:
        return None
    command = words[H_CTRL_CMD]
    arg = words[H_CTRL_ARG]
    if words[H_CTRL_SEQ] != seq:
        return None  # the agent is writing right now; take it on the next poll
    return ControlRequest(seq, command, arg)


def rejection(req: ControlRequest) -> str | None:
    """Why ``req`` cannot be acted on, or None if it is valid."""
    if req.command == Command.NONE:
        return None  # cancels a pending request
    if req.command == Command.CHECKPOINT_AT_STEP:
        if 0 <= req.arg < MAX_STEP_ARG:
            return None
        return f"step argument {req.arg} out of range"
    if req.command == Command.DUMP_FLIGHT_RECORDER:
        return None if req.arg == 0 else f"argument {req.arg} must be 0"
    return f"unknown command {req.command}"
