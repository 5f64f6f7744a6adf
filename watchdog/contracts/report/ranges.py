"""The report's limits, and the ranges a field's value must be in.

A field of the report's dataclasses (``fields.py``) is declared with one of
the types below: ``Count``, ``Seconds``, ``Text32``... Each is its Python type
``Annotated`` with a ``Range``, which says what the checks test (``kind``) and
the bounds (``ge``/``gt``/``lt``/``le``, ``max_length``), which the typed
reader hands to msgspec as they are. A plain ``int``/``float``/``bool``/``str``
is a field without a range: only its JSON type is checked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any

from watchdog.contracts.slot import FRAME_TEXT_BYTES

REPORT_VERSION = 1  # HostReport.to_dict()'s form: an object per rank and per step
ROWS_VERSION = 2  # the same content as arrays under field lists (as_rows)
REPORT_VERSIONS = (REPORT_VERSION, ROWS_VERSION)  # what this coordinator reads; its replies say so
MAX_FIELDS = 128  # names in one version-2 field list
MAX_FIELD_NAME = 64
MAX_RANKS_PER_REPORT = 4096
MAX_STEPS_PER_RANK = 256
MAX_COLLS_PER_RANK = 32  # collective signatures (Flight Recorder) per rank per report
MAX_ACKS_PER_REPORT = 256  # acks beyond this are dropped (counted), not journaled one by one
MAX_WORLD_SIZE = 1 << 20  # every per-rank structure is sized by it
MAX_COUNT = 1 << 62  # steps, sequence numbers, bytes, pids, start times: int64 words, never negative
MAX_SECONDS = 1e9  # ages and durations (31 years)
MIN_INTERVAL_S = 0.05  # a report interval below this would make every "k intervals" deadline meaningless
MAX_INTERVAL_S = 3600.0
SIG_TEXT = 32  # a short name: an op, a dtype, a clock
SIG_DIMS = 8
INT64 = 1 << 63
VERSIONS_TEXT = ", ".join(map(str, REPORT_VERSIONS))


class ReportError(ValueError):
    """A report that cannot be accepted; str() is the message sent back (4xx)."""


@dataclass(frozen=True)
class Range:
    """What a field's value must be beyond its JSON type. ``kind`` names the
    check (``checks.py`` writes each kind once, for every field of it):

    - count: an integer in [ge or gt, lt) (``gt=0``: also > 0)
    - seconds: a finite number in [ge, lt)
    - bounded: a finite number in [ge, lt), its message "out of range"
    - finite: a finite number
    - never_or_seconds: -1 (never), or seconds
    - int64: an integer a signed 64-bit word holds
    - world: the world size, in (gt, le]
    - rank: below the world size (and so in [ge, lt))
    - text: at most ``max_length`` characters
    """

    kind: str
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    le: float | None = None
    max_length: int | None = None

    def bounds(self) -> dict[str, Any]:
        """The bounds given, as msgspec's ``Meta`` takes them."""
        return {k: v for k, v in asdict(self).items() if k != "kind" and v is not None}


COUNT = Range("count", ge=0, lt=MAX_COUNT)
POSITIVE = Range("count", gt=0, lt=MAX_COUNT)
SECONDS = Range("seconds", ge=0.0, lt=MAX_SECONDS)
FINITE = Range("finite", ge=-1.7976931348623157e308, le=1.7976931348623157e308)
NEVER_OR_SECONDS = Range("never_or_seconds", ge=-1.0, lt=MAX_SECONDS)
WORD = Range("int64", ge=-INT64, le=INT64 - 1)
WORLD = Range("world", gt=0, le=MAX_WORLD_SIZE)
RANK = Range("rank", ge=0, lt=MAX_WORLD_SIZE)
PERCENT = Range("bounded", ge=0.0, lt=1e7)
EPOCH = Range("bounded", ge=0.0, lt=1e11)
SHORT = Range("text", max_length=SIG_TEXT)
FRAME = Range("text", max_length=FRAME_TEXT_BYTES)  # the slot's frame words hold this much

# The types fields are declared with (mypy reads each as its first argument).
Count = Annotated[int, COUNT]  # steps, sequence numbers, bytes, start times
Pid = Annotated[int, POSITIVE]
Seconds = Annotated[float, SECONDS]  # ages and durations; shares of a second per second too
Finite = Annotated[float, FINITE]
NeverOrSeconds = Annotated[float, NEVER_OR_SECONDS]  # -1 = never
Int64 = Annotated[int, WORD]  # a process group's key
WorldSize = Annotated[int, WORLD]
RankNo = Annotated[int, RANK]
Percent = Annotated[float, PERCENT]
Epoch = Annotated[float, EPOCH]  # wall clock, epoch seconds
Text32 = Annotated[str, SHORT]
FrameText = Annotated[str, FRAME]  # ``function (file.py:line)``
