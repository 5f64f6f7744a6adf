"""The slot file: the one contract between a training rank's hook and the host agent.

A slot file is a small fixed-size file, one per rank process, that the hook maps
into memory and updates with plain memory stores (no syscall, cannot block), and
that the agent reads with ``pread`` (a truncated file can never SIGBUS a reader).
Because it is a file, a SIGKILLed or SIGSTOPped rank's last state and last events
stay readable: exactly what a post-mortem needs.

Layout (version 2, little-endian, every number an int64 "word")::

    bytes 0 .. 511      header words (H_* indices below)
    bytes 512 .. 895    identity strings (job, host, run id), NUL padded
    bytes 896 .. 1023   progress words (P_* indices below; the identity's
                        reserved fourth field, zero in an older hook's slot)
    bytes 1024 ..       step ring: ``ring_capacity`` records of RECORD_WORDS words
                        (steps, phases, process group, control, errors)
    then                event ring: EVENT_RING_FACTOR x ``ring_capacity`` records
                        (COLL_SIG, COMPLETION: one or two per collective)

Why two rings: a burst of collectives (DDP buckets, FSDP's per-layer gathers)
writes a Flight Recorder signature and a GPU completion per collective; sharing
one 256-record ring, they pushed the step records out before the agent read
them. Each ring has its own head and record numbering. A version-1 slot (an
older hook) has one ring holding every kind; readers accept both versions.

Consistency. Header words H_STEP .. H_LAST_DYNAMIC are written under a seqlock:
the writer makes H_SEQ odd, stores, makes it even. A reader copies the header and
accepts it only if H_SEQ was even and unchanged around the copy. A few words have
a single writer and are read on their own, outside the seqlock: the heartbeat
(written by the hook's heartbeat thread) and the control block (written by the
agent, acknowledged by the hook). Ring records carry their own index, so a reader
can tell a record that was overwritten while it read.

Times are ``time.monotonic_ns()`` values: CLOCK_MONOTONIC is system-wide on Linux,
so the agent on the same host can subtract them from its own clock. The wall clock
at creation is stored too, to align hosts in a post-mortem.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mmap

MAGIC = int.from_bytes(b"RWDSLOT\x00", "little")
VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: one ring for every record kind (hooks before the event ring)
WORD = 8
HEADER_WORDS = 64  # 512 bytes
IDENTITY_OFFSET = 512
IDENTITY_FIELD_BYTES = 128
IDENTITY_FIELDS = ("job", "host", "run_id", "reserved")  # "reserved": the progress words
RING_OFFSET = 1024
RECORD_WORDS = 16
DEFAULT_RING_CAPACITY = 256
MAX_RING_CAPACITY = 1 << 16
# Event ring size, per step-ring record. A step writes one step record; each
# collective up to two events (its Flight Recorder signature, its GPU completion).
# 4 x 256 = 1024 events (128 KiB) hold ~500 collectives: a poll interval (0.1 s)
# of an FSDP job issuing a few thousand collectives a second.
EVENT_RING_FACTOR = 4
SLOT_SUFFIX = ".slot"
FR_DUMP_SUFFIX = ".fr"

# -- header word indices -------------------------------------------------------
# Written once at creation.
H_MAGIC = 0
H_VERSION = 1
H_RING_OFFSET = 2
H_RING_CAPACITY = 3
H_RECORD_WORDS = 4
H_SEQ = 5  # seqlock counter: odd while the hook writes words H_STEP..H_LAST_DYNAMIC
H_PID = 6
H_PROC_START_US = 7  # psutil.Process().create_time() in microseconds (pid-reuse guard)
H_RANK = 8
H_LOCAL_RANK = 9
H_WORLD_SIZE = 10
H_CREATED_WALL_NS = 11
H_CREATED_MONO_NS = 12
H_STATUS = 13  # Status; also written at exit
H_EVENT_RING_OFFSET = 14  # version 2: byte offset of the event ring (0 in version 1)
H_EVENT_RING_CAPACITY = 15  # version 2: its capacity in records
# Dynamic, under the seqlock.
H_STEP = 16  # steps completed
H_STEP_START_NS = 17  # monotonic start of the step in progress
H_LAST_STEP_NS = 18  # duration of the last completed step
H_LAST_DATA_NS = 19  # of which waiting on the data iterator
H_LAST_COLL_NS = 20  # of which inside collectives (union of overlapping ones)
H_TOTAL_STEP_NS = 21  # running sums: rates and windows come from differences
H_TOTAL_DATA_NS = 22
H_TOTAL_COLL_NS = 23
H_PHASE = 24  # Phase
H_PHASE_SINCE_NS = 25
H_DATA_ENTER_NS = 26  # waiting on data now iff DATA_ENTER > DATA_EXIT
H_DATA_EXIT_NS = 27
H_COLL_GROUP = 28  # group_key() of the last collective entered
H_COLL_SEQ = 29  # per-group sequence number of the last collective entered (1-based)
H_COLL_OP = 30  # CollOp
H_COLL_BYTES = 31
H_COLL_ENTER_NS = 32
H_COLL_EXIT_NS = 33  # when the last collective completed
H_COLL_OUTSTANDING = 34  # collectives entered and not yet completed
H_COLL_DONE_SEQ = 35  # seq of the last completed collective on H_COLL_GROUP
H_PG_STATE = 36  # PgState
H_PG_CHANGE_NS = 37
H_HOOK_ERRORS = 38  # errors the hook caught (never raised into training)
H_RING_HEAD = 39  # records ever written; the next goes to head % capacity
# Training health, written only by ``mon.step(loss=...)`` (added in place, still
# version 1: see LOSS_WORDS below).
H_LOSS_BITS = 40  # the last loss reported, IEEE-754 double bits
H_LOSS_STEP = 41  # the step that loss ended; 0 = no loss reported (an older hook, or none given)
H_LOSS_BAD_STEP = 42  # first step whose loss was NaN or infinite in this process; 0 = none
H_LOSS_BAD_COUNT = 43  # steps whose loss was NaN or infinite
# Where the time goes, finer (added in place, still version 1: see SPLIT_WORDS below).
H_TOTAL_COLL_BYTES = 44  # running sum of the bytes of every collective entered
H_BATCH_PER_RANK = 45  # samples per batch on this rank (the timed loader's, or set); 0 = unknown
# The hook's last Flight Recorder read (added in place, still version 1: see FR_READ_WORDS
# below): the newest collective it held, and when the read began (monotonic ns, 0 = never).
H_FR_NEWEST_GROUP = 46
H_FR_NEWEST_SEQ = 47
H_LAST_DYNAMIC = 47
# A second seqlocked block: running sums (ns) of the opt-in finer split of
# compute (mon.watch_model) and of host-to-device copies (wrap_loader(device=)).
H_TOTAL_FWD_NS = 50
H_TOTAL_BWD_NS = 51
H_TOTAL_OPT_NS = 52
H_TOTAL_H2D_NS = 53
H_SPLIT_LAST = 53
H_FR_READ_NS = 54  # seqlocked with H_FR_NEWEST_*: one bracket writes the three
H_EVENT_RING_HEAD = 55  # version 2: events ever written; the next goes to head % event capacity
# Single-writer words, read outside the seqlock.
H_HEARTBEAT_NS = 48  # hook heartbeat thread
H_HEARTBEAT_COUNT = 49
H_CTRL_SEQ = 56  # agent: bump last, after CTRL_CMD/CTRL_ARG
H_CTRL_CMD = 57  # Command
H_CTRL_ARG = 58
# Written once at creation (added in place, still version 2: zero in every slot an older
# hook wrote, and never read by an older agent): the process's start in clock ticks after
# boot (field 22 of /proc/<pid>/stat), the part of its start time that a step of the wall
# clock never moves; 0 = not known. See agent/processes/steadystart.py.
H_PROC_START_TICKS = 59
H_CTRL_ACK_SEQ = 60  # hook: the CTRL_SEQ it acted on, written last
H_CTRL_ACK_RESULT = 61  # 0 ok, <0 failed
H_CTRL_ACK_STEP = 62
H_CTRL_ACK_NS = 63

# Progress the script does not report (watchdog.hook.marks.progress), added in place,
# still version 2: 16 words in the identity's reserved field (bytes 896..1023),
# zero in every slot an older hook wrote (its reserved string is empty) and never
# read by an older agent, whose identity decoder drops that field. Word indices
# count from the start of the file, like H_*. Single writer (the hook's heartbeat
# thread), read on their own outside the seqlock, like the heartbeat.
PROGRESS_OFFSET = IDENTITY_OFFSET + 3 * IDENTITY_FIELD_BYTES
P_FIRST = PROGRESS_OFFSET // WORD
P_TRAIN_FORWARDS = P_FIRST  # module forwards in train mode with grad enabled
P_EVAL_FORWARDS = P_FIRST + 1  # module forwards in eval mode, under no_grad or inference_mode
P_BACKWARDS = P_FIRST + 2  # torch.autograd.backward calls (loss.backward())
P_OPTIMIZER_STEPS = P_FIRST + 3  # optimizer.step() calls
P_PROGRESS_NS = P_FIRST + 4  # the heartbeat that last saw any of the above (or a step) move; 0 = never
P_AUTO_PHASE = P_FIRST + 5  # the Phase the hook opened by itself (EVAL), 0 = none open
P_AUTO_SINCE_NS = P_FIRST + 6  # when it opened it
P_AUTO_COUNT = P_FIRST + 7  # automatic phases opened so far
P_LAST = P_FIRST + 7
PROGRESS_WORDS = (
    P_TRAIN_FORWARDS,
    P_EVAL_FORWARDS,
    P_BACKWARDS,
    P_OPTIMIZER_STEPS,
    P_PROGRESS_NS,
    P_AUTO_PHASE,
    P_AUTO_SINCE_NS,
    P_AUTO_COUNT,
)
# Where the training thread was during a long step (watchdog.hook.marks.frames), the
# progress area's other 8 words, added in place the same way (zero in an older
# hook's slot: no frame): the step it was in (steps completed + 1), when it was
# sampled, and ``function (file.py:line)`` as UTF-8 with a CRC-32 of the three
# in its last 4 bytes. Single writer (the heartbeat thread), read outside the
# seqlock: a reader whose copy straddled a write finds the CRC wrong and sees no
# frame (``decode_frame``), never a frame paired with another step.
P_FRAME_STEP = P_FIRST + 8
P_FRAME_NS = P_FIRST + 9
P_FRAME_TEXT = P_FIRST + 10  # .. P_FIRST + 15
FRAME_WORDS = 8
FRAME_TEXT_BYTES = (FRAME_WORDS - 2) * WORD - 4  # 44: the text, then its CRC
_FRAME = struct.Struct(f"<qq{FRAME_TEXT_BYTES}sI")
_FRAME_WORDS = struct.Struct(f"<{FRAME_WORDS}q")


def encode_frame(step: int, t_ns: int, text: str) -> tuple[int, ...]:
    """The frame words P_FRAME_STEP .. P_FIRST + 15 for ``text`` sampled in step
    ``step`` at ``t_ns`` (cut to FRAME_TEXT_BYTES, never inside a character)."""
    raw = text.encode("utf-8", "replace")[:FRAME_TEXT_BYTES].decode("utf-8", "ignore").encode("utf-8")
    body = _FRAME.pack(step, t_ns, raw, 0)
    crc = zlib.crc32(body[: _FRAME.size - 4])
    return _FRAME_WORDS.unpack(body[: _FRAME.size - 4] + struct.pack("<I", crc))


def decode_frame(words: tuple[int, ...]) -> tuple[int, int, str] | None:
    """(step, sampled ns, text) from the frame words, or None: none written (an
    older hook), or a copy torn by a write (its CRC does not match)."""
    if len(words) != FRAME_WORDS or words[1] <= 0:
        return None
    body = _FRAME_WORDS.pack(*words)
    step, t_ns, raw, crc = _FRAME.unpack(body)
    if zlib.crc32(body[: _FRAME.size - 4]) != crc or step <= 0:
        return None
    return step, t_ns, raw.split(b"\x00", 1)[0].decode("utf-8", "replace")


# Why the loss words did not bump VERSION: words 40..43 were reserved and zero
# in every version-1 slot (init_slot zeroes the header, no hook wrote them), and
# a version-1 reader never looks at them. So a new hook's slot is still read by
# an old agent (the loss is simply not reported), and a new agent reading an old
# hook's slot sees H_LOSS_STEP == 0: "no loss reported". A bump would have made
# every agent older than the hook refuse every slot for a field it cannot use.
LOSS_WORDS = (H_LOSS_BITS, H_LOSS_STEP, H_LOSS_BAD_STEP, H_LOSS_BAD_COUNT)
# The same reasoning for words 44..47 and 50..53 (zero in every slot an older
# hook wrote, never read by an older agent): zero means "not measured", and the
# agent reports them as absent.
SPLIT_WORDS = (H_TOTAL_FWD_NS, H_TOTAL_BWD_NS, H_TOTAL_OPT_NS, H_TOTAL_H2D_NS)
SPLIT_PARTS = ("forward", "backward", "optimizer", "h2d")
# And for 46, 47 and 54: H_FR_READ_NS == 0 means "never read" (or an older hook).
# A coordinator names a rank behind in the Flight Recorder only from a read made
# after the stall began, so this time is what makes the picture usable.
FR_READ_WORDS = (H_FR_NEWEST_GROUP, H_FR_NEWEST_SEQ, H_FR_READ_NS)


def seqlocked(index: int) -> bool:
    """Whether header word ``index`` changes only inside a seqlock bracket."""
    return H_STEP <= index <= H_LAST_DYNAMIC or H_TOTAL_FWD_NS <= index <= H_EVENT_RING_HEAD or index == H_SEQ


_DOUBLE = struct.Struct("<d")
_INT64 = struct.Struct("<q")


def loss_bits(value: float) -> int:
    """A float as the int64 word that holds its bits (NaN and inf included)."""
    return _INT64.unpack(_DOUBLE.pack(value))[0]


def loss_value(bits: int) -> float:
    return _DOUBLE.unpack(_INT64.pack(bits))[0]


# -- ring record word indices --------------------------------------------------
R_INDEX = 0  # record number (== head at write time); validates against overwrite
R_KIND = 1  # RecordKind
R_T_NS = 2  # monotonic time of the event
R_STEP = 3
R_A, R_B, R_C, R_D, R_E, R_F, R_G = 4, 5, 6, 7, 8, 9, 10
R_H, R_I, R_J, R_K, R_L = 11, 12, 13, 14, 15
# STEP_END payload: A step_ns, B data_ns, C coll_ns, D collectives in the step,
#                   E last coll seq, F phase (the first checkpoint or eval
#                   phase open during the step, else the phase at its end),
#                   G data waits in the step,
#                   H collective bytes in the step, I forward ns, J backward ns,
#                   K optimizer ns, L host-to-device copy ns (H..L: 0 when not
#                   measured; an older hook left them 0 too)
# PHASE payload:    A phase entered, B phase left
# PG payload:       A PgState
# CONTROL payload:  A ctrl seq, B command, C result
# ERROR payload:    A total hook errors
# COLL_SIG payload: one collective as PyTorch's Flight Recorder saw it (hook's
#                   background thread, watchdog.hook.completion.flight_recorder): A group key,
#                   B seq (FR collective_seq_id, counts collectives issued from C++
#                   too), C CollOp, D elements over all inputs, E DType, F CollState,
#                   G first input's shape (pack_shape), H created, I started,
#                   J completed (0 = not yet), K the Clock of H..J, L inputs
# COMPLETION payload: when the accelerator reached a marker queued after a
#                   collective or a step (watchdog.hook.completion.tracker): A what (1
#                   collective, 2 step), B group key, C seq (or step), D enqueued
#                   (Clock.MONOTONIC), E completed, F the Clock of E and G, G
#                   started: when the accelerator reached the marker queued just
#                   before the collective (0 = not known; steps have none).
#                   R_STEP: steps completed when it was queued (a collective of
#                   step k carries k - 1; the marker ending step k carries k)


class Status(enum.IntEnum):
    STARTING = 0
    RUNNING = 1
    EXITED = 2  # interpreter exit seen by the hook (atexit)
    DISABLED = 3  # hook gave up after repeated errors; slot is frozen
    FAILED = 4  # the interpreter is exiting on an uncaught exception: a crash, not a clean exit


class Phase(enum.IntEnum):
    TRAIN = 0
    INIT = 1
    CHECKPOINT = 2
    EVAL = 3
    SHUTDOWN = 4
    OTHER = 5

    @property
    def label(self) -> str:
        return self.name.lower()


class CollOp(enum.IntEnum):
    OTHER = 0
    ALL_REDUCE = 1
    BROADCAST = 2
    ALL_GATHER = 3
    REDUCE_SCATTER = 4
    BARRIER = 5
    ALL_TO_ALL = 6
    REDUCE = 7
    GATHER = 8
    SCATTER = 9
    SEND = 10
    RECV = 11
    DDP_ALL_REDUCE = 12  # gradient bucket all-reduce issued by DDP's reducer

    @property
    def label(self) -> str:
        return self.name.lower()


class PgState(enum.IntEnum):
    NONE = 0  # init_process_group not called yet
    INITIALIZING = 1  # inside init_process_group (rendezvous)
    JOINED = 2
    DESTROYED = 3


class RecordKind(enum.IntEnum):
    STEP_END = 1
    PHASE = 2
    PG = 3
    CONTROL = 4
    ERROR = 5
    COLL_SIG = 6
    COMPLETION = 7


class Clock(enum.IntEnum):
    """Which clock a time in the slot came from: figures from different clocks
    are never subtracted from each other without saying so."""

    NONE = 0  # no time known
    MONOTONIC = 1  # this host's CLOCK_MONOTONIC ns (the hook's own marks)
    WALL = 2  # epoch ns (Flight Recorder's timestamps: c10::getTime)
    GPU_EVENT = 3  # monotonic ns placed by a CUDA event's elapsed time after an anchor event

    @property
    def label(self) -> str:
        return self.name.lower()


class CollState(enum.IntEnum):
    """A collective's progress as the Flight Recorder reports it. On gloo it stays
    SCHEDULED; on NCCL it moves through STARTED and COMPLETED with the GPU."""

    UNKNOWN = 0
    SCHEDULED = 1
    STARTED = 2
    COMPLETED = 3

    @property
    def label(self) -> str:
        return self.name.lower()


# Tensor dtypes by code (COLL_SIG word E); 0 = unknown.
DTYPES = (
    "unknown",
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "other",
)
SHAPE_DIM_BITS = 20
SHAPE_MAX_DIMS = 3
_SHAPE_UNPACKED = 7  # ndim field value: the shape did not fit in one word


def pack_shape(dims: Iterable[int]) -> int:
    """A shape of up to three dims, each < 2**20, in one int64 word (ndim in bits
    60..62); anything else packs as "not packed" (unpack_shape returns None)."""
    dims = tuple(dims)
    if len(dims) > SHAPE_MAX_DIMS or any(not isinstance(d, int) or not 0 <= d < (1 << SHAPE_DIM_BITS) for d in dims):
        return _SHAPE_UNPACKED << 60
    word = len(dims) << 60
    for i, d in enumerate(dims):
        word |= d << (SHAPE_DIM_BITS * (SHAPE_MAX_DIMS - 1 - i))
    return word


def unpack_shape(word: int) -> tuple[int, ...] | None:
    ndim = (word >> 60) & 7
    if word < 0 or ndim > SHAPE_MAX_DIMS:
        return None
    mask = (1 << SHAPE_DIM_BITS) - 1
    return tuple((word >> (SHAPE_DIM_BITS * (SHAPE_MAX_DIMS - 1 - i))) & mask for i in range(ndim))


class Command(enum.IntEnum):
    NONE = 0
    CHECKPOINT_AT_STEP = 1  # arg: step S; hook calls the registered save fn after S
    DUMP_FLIGHT_RECORDER = 2  # arg: 0; the hook's background thread writes fr_dump_filename()


def group_key(name: str) -> int:
    """A stable int64 for a process-group name, equal on every rank. '' and '0'
    (torch's name for the default group) map to 0."""
    if name in ("", "0"):
        return 0
    return zlib.crc32(name.encode("utf-8", "replace")) or 1


def event_ring_offset(ring_capacity: int) -> int:
    """Where the event ring starts: right after the step ring."""
    return RING_OFFSET + ring_capacity * RECORD_WORDS * WORD


def slot_size(ring_capacity: int) -> int:
    """Bytes of a version-2 slot: header, step ring, event ring."""
    return event_ring_offset(ring_capacity) + EVENT_RING_FACTOR * ring_capacity * RECORD_WORDS * WORD


def slot_filename(job: str, rank: int, pid: int) -> str:
    return f"{_safe(job)}.rank{rank}.pid{pid}{SLOT_SUFFIX}"


def rollback_filename(job: str) -> str:
    """The job's rollback request in the run directory: JSON written by the agent
    (``rollback`` command), read by the restarted script (watchdog.hook.rollback)."""
    return f"{_safe(job)}.rollback.json"


def fr_dump_filename(slot_name: str) -> str:
    """Where a rank's hook writes its Flight Recorder dump on request: next to its
    slot (``<slot file name>.fr``, the pickle torch's own dump returns)."""
    return slot_name + FR_DUMP_SUFFIX


def _safe(job: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in job)[:64] or "job"


@dataclass(frozen=True)
class Identity:
    job: str
    host: str
    rank: int
    local_rank: int
    world_size: int
    pid: int
    proc_start_us: int
    run_id: str = ""
    proc_start_ticks: int = 0  # H_PROC_START_TICKS; 0: not known (an older hook, or not Linux)


def init_slot(
    buf: mmap.mmap | bytearray, identity: Identity, ring_capacity: int, *, wall_ns: int, mono_ns: int
) -> None:
    """Format ``buf`` (a writable buffer of slot_size(ring_capacity) bytes) as a
    fresh version-2 slot. Used by the hook at install and by tests."""
    if not 1 <= ring_capacity <= MAX_RING_CAPACITY:
        raise ValueError(f"ring capacity must be in 1..{MAX_RING_CAPACITY}, got {ring_capacity}")
    size = slot_size(ring_capacity)
    if len(buf) < size:
        raise ValueError(f"slot buffer is {len(buf)} bytes, needs {size}")
    mv = memoryview(buf)
    mv[:size] = bytes(size)
    words = mv[: HEADER_WORDS * WORD].cast("q")
    for i, text in enumerate((identity.job, identity.host, identity.run_id, "")):
        raw = text.encode("utf-8", "replace")[: IDENTITY_FIELD_BYTES - 1]
        raw = raw.decode("utf-8", "ignore").encode("utf-8")  # never cut a character in half
        off = IDENTITY_OFFSET + i * IDENTITY_FIELD_BYTES
        mv[off : off + len(raw)] = raw
    words[H_VERSION] = VERSION
    words[H_RING_OFFSET] = RING_OFFSET
    words[H_RING_CAPACITY] = ring_capacity
    words[H_RECORD_WORDS] = RECORD_WORDS
    words[H_EVENT_RING_OFFSET] = event_ring_offset(ring_capacity)
    words[H_EVENT_RING_CAPACITY] = EVENT_RING_FACTOR * ring_capacity
    words[H_PID] = identity.pid
    words[H_PROC_START_US] = identity.proc_start_us
    words[H_PROC_START_TICKS] = identity.proc_start_ticks
    words[H_RANK] = identity.rank
    words[H_LOCAL_RANK] = identity.local_rank
    words[H_WORLD_SIZE] = identity.world_size
    words[H_CREATED_WALL_NS] = wall_ns
    words[H_CREATED_MONO_NS] = mono_ns
    words[H_STEP_START_NS] = mono_ns
    words[H_PHASE_SINCE_NS] = mono_ns
    words[H_HEARTBEAT_NS] = mono_ns
    words[H_STATUS] = Status.STARTING
    # Magic last: a reader never accepts a half-formatted slot.
    words[H_MAGIC] = MAGIC
    words.release()
    mv.release()


# -- reading -------------------------------------------------------------------


class SlotError(Exception):
    """A slot file that cannot be read; ``reason`` is a short counter label."""

    reason = "corrupt"


class CorruptSlot(SlotError):
    reason = "corrupt"


class UnsupportedVersion(SlotError):
    reason = "version"


class TornRead(SlotError):
    """The writer was mid-update on every attempt (or died mid-update)."""

    reason = "torn"


class NotRegular(SlotError):
    """A FIFO, socket, device or directory named like a slot: never opened for
    reading data (a FIFO would block the reader for good)."""

    reason = "type"


class SymlinkSlot(SlotError):
    """A symbolic link named like a slot: never followed (it could point anywhere)."""

    reason = "link"


class ForeignSlot(SlotError):
    """The file at the path is not the slot that was validated (replaced, owned by
    someone else, hard-linked): nothing is written to it."""

    reason = "owner"


@dataclass(frozen=True)
class Record:
    index: int
    kind: int
    t_ns: int
    step: int
    payload: tuple[int, ...]  # words R_A .. end

    def to_words(self) -> list[int]:
        words = [self.index, self.kind, self.t_ns, self.step, *self.payload]
        return words + [0] * (RECORD_WORDS - len(words))


@dataclass(frozen=True)
class SlotHeader:
    version: int
    ring_capacity: int
    identity: Identity
    created_wall_ns: int
    created_mono_ns: int
    status: int
    words: tuple[int, ...] = field(repr=False)  # every header word, for the fields below
    event_ring_capacity: int = 0  # 0: a version-1 slot, every record kind on the one ring
    progress: tuple[int, ...] = field(default=(0,) * len(PROGRESS_WORDS), repr=False)  # PROGRESS_WORDS' values
    frame_words: tuple[int, ...] = field(default=(0,) * FRAME_WORDS, repr=False)  # P_FRAME_STEP on

    @property
    def frame(self) -> tuple[int, int, str] | None:
        """(step, sampled ns, ``function (file.py:line)``) of the hook's last frame sample, or None."""
        return decode_frame(self.frame_words)

    def progress_word(self, index: int) -> int:
        """One P_* word (0 in an older hook's slot)."""
        return self.progress[index - P_FIRST]

    @property
    def event_head(self) -> int:
        """Events ever written (0 in a version-1 slot)."""
        return self.words[H_EVENT_RING_HEAD] if self.event_ring_capacity else 0

    def __getitem__(self, index: int) -> int:
        return self.words[index]

    @property
    def heartbeat_ns(self) -> int:
        return self.words[H_HEARTBEAT_NS]

    @property
    def loss(self) -> float | None:
        """The last loss the hook was given (NaN/inf as such), or None: no loss reported."""
        return loss_value(self.words[H_LOSS_BITS]) if self.words[H_LOSS_STEP] > 0 else None

    @property
    def in_collective(self) -> bool:
        return self.words[H_COLL_OUTSTANDING] > 0

    @property
    def in_data_wait(self) -> bool:
        return self.words[H_DATA_ENTER_NS] > self.words[H_DATA_EXIT_NS]


def _decode_identity(raw: bytes) -> list[str]:
    out = []
    for i in range(len(IDENTITY_FIELDS)):
        chunk = raw[i * IDENTITY_FIELD_BYTES : (i + 1) * IDENTITY_FIELD_BYTES]
        out.append(chunk.split(b"\x00", 1)[0].decode("utf-8", "replace"))
    return out


def decode_header(raw: bytes) -> SlotHeader:
    """Decode the first RING_OFFSET bytes of a slot. Raises SlotError subclasses."""
    if len(raw) < RING_OFFSET:
        raise CorruptSlot(f"slot is {len(raw)} bytes, shorter than its {RING_OFFSET}-byte header")
    words = struct.unpack_from(f"<{HEADER_WORDS}q", raw, 0)
    if words[H_MAGIC] != MAGIC:
        raise CorruptSlot("bad magic (not a rank-watchdog slot, or not formatted yet)")
    if words[H_VERSION] not in READABLE_VERSIONS:
        raise UnsupportedVersion(f"slot version {words[H_VERSION]}, this reader knows {READABLE_VERSIONS}")
    cap = words[H_RING_CAPACITY]
    if (
        words[H_RING_OFFSET] != RING_OFFSET
        or words[H_RECORD_WORDS] != RECORD_WORDS
        or not 1 <= cap <= MAX_RING_CAPACITY
    ):
        raise CorruptSlot("ring geometry out of range")
    event_cap = 0
    if words[H_VERSION] >= 2:
        # The one layout version 2 allows: a forged offset or size could point
        # reads anywhere in the file, or make them huge.
        event_cap = words[H_EVENT_RING_CAPACITY]
        if words[H_EVENT_RING_OFFSET] != event_ring_offset(cap) or event_cap != EVENT_RING_FACTOR * cap:
            raise CorruptSlot("event ring geometry out of range")
        if words[H_EVENT_RING_HEAD] < 0:
            raise CorruptSlot("event ring head is negative")
    job, host, run_id, _ = _decode_identity(raw[IDENTITY_OFFSET:RING_OFFSET])
    ident = Identity(
        job=job,
        host=host,
        rank=words[H_RANK],
        local_rank=words[H_LOCAL_RANK],
        world_size=words[H_WORLD_SIZE],
        pid=words[H_PID],
        proc_start_us=words[H_PROC_START_US],
        run_id=run_id,
        proc_start_ticks=words[H_PROC_START_TICKS],
    )
    if (
        ident.rank < 0
        or ident.world_size <= 0
        or ident.rank >= ident.world_size
        or ident.pid <= 0
        or ident.proc_start_ticks < 0
    ):
        raise CorruptSlot(
            f"identity out of range (rank={ident.rank} world={ident.world_size} pid={ident.pid}"
            f" start ticks={ident.proc_start_ticks})"
        )
    return SlotHeader(
        version=words[H_VERSION],
        ring_capacity=cap,
        identity=ident,
        created_wall_ns=words[H_CREATED_WALL_NS],
        created_mono_ns=words[H_CREATED_MONO_NS],
        status=words[H_STATUS],
        words=words,
        event_ring_capacity=event_cap,
        progress=struct.unpack_from(f"<{len(PROGRESS_WORDS)}q", raw, PROGRESS_OFFSET),
        frame_words=_FRAME_WORDS.unpack_from(raw, P_FRAME_STEP * WORD),
    )


def decode_records(raw_ring: bytes, ring_capacity: int, head: int, since: int = 0, base: int = 0) -> list[Record]:
    """Records with index in [max(since, head - capacity), head), oldest first.
    ``raw_ring`` is the ring area as read, from ring place ``base`` on (a reader
    that copied only the places it needs). A slot whose record does not carry the
    index expected at its position was overwritten during the read (or is
    corrupt); such records are dropped, never misattributed."""
    if head <= 0:
        return []
    first = max(since, head - ring_capacity, 0)
    out: list[Record] = []
    rec_bytes = RECORD_WORDS * WORD
    for index in range(first, head):
        off = (index % ring_capacity - base) * rec_bytes
        if off < 0 or off + rec_bytes > len(raw_ring):
            continue  # cut short; a later index may wrap to a place that is there
        w = struct.unpack_from(f"<{RECORD_WORDS}q", raw_ring, off)
        if w[R_INDEX] != index:
            continue
        out.append(Record(index=w[R_INDEX], kind=w[R_KIND], t_ns=w[R_T_NS], step=w[R_STEP], payload=tuple(w[R_A:])))
    return out


@dataclass(frozen=True)
class SlotSnapshot:
    path: str
    header: SlotHeader
    records: tuple[Record, ...]  # the step ring (a version-1 slot: every record)
    torn: bool = False  # header words may be mid-update (writer stopped inside a write)
    # The file as opened (fstat of the fd that was read): who owns it decides
    # whether its identity is believed (agent/slotfiles/tracker.py); -1 = not known.
    uid: int = -1
    inode: int = 0
    # The event ring (COLL_SIG, COMPLETION), numbered on its own; () in a version-1 slot.
    events: tuple[Record, ...] = ()

    @property
    def all_records(self) -> tuple[Record, ...]:
        """Both rings, step ring first (indices of the two are not comparable)."""
        return self.records + self.events if self.events else self.records


# Every open of a slot: the last path component is never followed (O_NOFOLLOW),
# and never waited on (O_NONBLOCK: a FIFO named *.slot opens at once instead of
# blocking until a writer appears). fstat then accepts regular files only.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_slot_file(path: str, *, write: bool = False) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file at ``path``, opened once and never through a
    symlink. Raises SymlinkSlot, NotRegular or OSError; the caller closes the fd."""
    try:
        fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkSlot(f"{path} is a symbolic link; slot files are never followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_header_consistent(fd: int, attempts: int = 8) -> tuple[SlotHeader, bool]:
    """pread the header until the seqlock says it is consistent. A writer that was
    stopped (SIGSTOP) or killed between the two seq stores leaves H_SEQ odd forever:
    after ``attempts`` we return what we read with torn=True rather than nothing,
    since a stopped rank is precisely the one we must still report."""
    raw = b""
    for _ in range(attempts):
        raw = os.pread(fd, RING_OFFSET, 0)
        header = decode_header(raw)
        seq = header[H_SEQ]
        if seq % 2 == 0:
            again = struct.unpack("<q", os.pread(fd, WORD, H_SEQ * WORD))[0]
            if again == seq:
                return header, False
    return decode_header(raw), True


def _read_ring(
    fd: int, header: SlotHeader, offset: int, cap: int, head: int, head_word: int, since: int
) -> list[Record]:
    """Records [since, head) of one ring, read by pread of only the places they
    occupy (one or two spans: a reader polling at 20 Hz copies what is new, not
    the whole ring)."""
    first = max(since, head - cap, 0)
    if head <= first:
        return []
    rec_bytes = RECORD_WORDS * WORD
    a, b = first % cap, (head - 1) % cap
    if a <= b:
        base, raw = a, os.pread(fd, (b - a + 1) * rec_bytes, offset + a * rec_bytes)
    else:  # wrapped: the tail of the ring, then its start
        base, raw = 0, os.pread(fd, cap * rec_bytes, offset)
    # Did the writer write while we copied the ring? Record i shares its place
    # with record i + cap: records up to head_now - 1 - cap were overwritten by
    # finished writes, and while a bracket is open (odd seq, also a writer stopped
    # mid-write) record head_now - cap may be half overwritten, its index word
    # still reading as its own.
    n = head_word - H_SEQ + 1
    span = os.pread(fd, n * WORD, H_SEQ * WORD)
    seq_now, head_now = header[H_SEQ], head
    if len(span) == n * WORD:
        seq_now = struct.unpack_from("<q", span, 0)[0]
        head_now = struct.unpack_from("<q", span, (head_word - H_SEQ) * WORD)[0]
    if seq_now % 2:
        since = max(since, head_now - cap + 1)
    elif seq_now != header[H_SEQ]:
        since = max(since, head_now - cap)
    return decode_records(raw, cap, head, since, base)


def read_slot(path: str, since: int = 0, events_since: int = 0) -> SlotSnapshot:
    """Read one slot file without mapping it (a truncated mmap would SIGBUS us).
    Step-ring records with index >= ``since`` only, event-ring records with
    index >= ``events_since``. Raises SlotError or OSError; never blocks (see
    ``open_slot_file``)."""
    fd, st = open_slot_file(path)
    try:
        header, torn = read_header_consistent(fd)
        cap = header.ring_capacity
        records = _read_ring(fd, header, RING_OFFSET, cap, header[H_RING_HEAD], H_RING_HEAD, since)
        events: list[Record] = []
        if header.event_ring_capacity:
            events = _read_ring(
                fd,
                header,
                header[H_EVENT_RING_OFFSET],
                header.event_ring_capacity,
                header.event_head,
                H_EVENT_RING_HEAD,
                events_since,
            )
        return SlotSnapshot(
            path=path,
            header=header,
            records=tuple(records),
            torn=torn,
            uid=st.st_uid,
            inode=st.st_ino,
            events=tuple(events),
        )
    finally:
        os.close(fd)


def write_control(
    path: str, ctrl_seq: int | None, command: Command, arg: int, *, expect: SlotSnapshot | None = None
) -> int:
    """Agent side of the control block: command and argument first, the sequence
    number last, so the hook never acts on a half-written command.

    One open, by fd, never through a symlink: with ``expect`` (the snapshot the
    agent validated), the file is written only if the fd opened here is that very
    file (same inode and owner, one link) and its header, read through this fd,
    still names the same process. ``ctrl_seq`` None: one past the sequence read
    through this fd. Returns the sequence written."""
    fd, st = open_slot_file(path, write=True)
    try:
        header = decode_header(os.pread(fd, RING_OFFSET, 0))
        if expect is not None:
            want = expect.header.identity
            got = header.identity
            if (
                st.st_ino != expect.inode
                or st.st_uid != expect.uid
                or st.st_nlink != 1
                or (got.pid, got.proc_start_us, got.rank, got.job)
                != (want.pid, want.proc_start_us, want.rank, want.job)
            ):
                raise ForeignSlot(
                    f"{path} is no longer the slot of rank {want.rank} pid {want.pid} that was "
                    f"validated (replaced, relinked or another owner): not written"
                )
        if ctrl_seq is None:
            ctrl_seq = header.words[H_CTRL_SEQ] + 1
        os.pwrite(fd, struct.pack("<q", int(command)), H_CTRL_CMD * WORD)
        os.pwrite(fd, struct.pack("<q", int(arg)), H_CTRL_ARG * WORD)
        os.pwrite(fd, struct.pack("<q", int(ctrl_seq)), H_CTRL_SEQ * WORD)
        return int(ctrl_seq)
    finally:
        os.close(fd)


def list_slot_files(run_dir: str) -> Iterable[str]:
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(run_dir, n) for n in names if n.endswith(SLOT_SUFFIX))
