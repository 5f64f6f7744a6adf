"""Where the training thread is during a long step: its frame in the user's script.

A rank that holds the job (an evaluation, a metrics upload, a blocking log flush,
a save) does so somewhere in the script: naming it turns "rank 0 holds the job
~6 s every 1,000 steps" into "... in estimate_loss", and makes a stall that
recurs in the same place recognisable as the same one (coordinator/analysis/intermittent_stalls.py).

The heartbeat thread samples the training thread's stack (``sys._current_frames``)
only while the step in progress has run long (``should_sample``: much longer than
the last step, and some hundreds of milliseconds) and the rank is not waiting in
a collective or on its data loader (a waiting rank's frame says where it waits,
not what holds the job; a loader's stalls stay loader_starvation's). A job in its steady state never pays for it; a long step pays one stack
walk of at most ``MAX_DEPTH`` frames per beat (tens of microseconds). The frame
kept is the innermost one in the script that was run (``__main__``'s file), or
else the innermost outside the interpreter's and installed packages' directories
(torch, the standard library, this package): the user's function that called into
the library, not the library's internals. Written as ``function (file.py:line)``
into the slot's frame words with the step it was in (wire.encode_frame).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import watchdog
from watchdog.contracts import slot as wire

SAMPLE_MIN_NS = 250_000_000  # a step in progress this long (and FACTOR x the last) is sampled
SAMPLE_FACTOR = 2
MAX_DEPTH = 256  # frames walked at most: a deep recursion costs no more than this


def should_sample(steps: int, step_age_ns: int, last_step_ns: int, waiting: bool) -> bool:
    """Sample now: past the first step, not ``waiting`` (in a collective or on the
    data loader: what holds it then is another rank or its loader, not its own
    work), and the step in progress much longer than the last one."""
    return steps > 0 and not waiting and step_age_ns >= max(SAMPLE_MIN_NS, SAMPLE_FACTOR * last_step_ns)


def library_dirs() -> tuple[str, ...]:
    """Directories whose code is not the user's: the standard library, installed
    packages, this package."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(os.path.dirname(os.path.abspath(watchdog.__file__)))  # watchdog/, wherever this module sits in it
    return tuple(sorted(os.path.join(os.path.realpath(d), "") for d in dirs if d))


def main_file() -> str:
    """The script that was run (``python script.py`` under torchrun), or ""."""
    f = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.realpath(f) if isinstance(f, str) else ""


def user_frame(frame: FrameType | None, main: str, libraries: Iterable[str], real: Callable[[str], str]) -> str:
    """``function (file.py:line)`` of the innermost frame of ``frame``'s stack in
    the ``main`` script, else of the innermost outside ``libraries``; "" if none.
    ``real`` maps a code object's file name to its real path (cached by the caller)."""
    libs = tuple(libraries)
    fallback: FrameType | None = None
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        name = frame.f_code.co_filename
        if not name.startswith("<"):
            path = real(name)
            if main and path == main:
                return describe(frame)
            if fallback is None and not path.startswith(libs):
                fallback = frame
        frame = frame.f_back
        depth += 1
    return describe(fallback) if fallback is not None else ""


def describe(frame: FrameType) -> str:
    """``function (file.py:line)`` in the slot's FRAME_TEXT_BYTES: a long function
    name is cut (ending in "~") rather than the place after it."""
    name, place = frame.f_code.co_name, f" ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"
    room = wire.FRAME_TEXT_BYTES - len(place.encode("utf-8", "replace"))
    raw = name.encode("utf-8", "replace")
    if len(raw) > room >= 8:
        name = raw[: room - 1].decode("utf-8", "ignore") + "~"
    return name + place


class FrameSampler:
    """The heartbeat's side: sample the training thread's frame during long steps."""

    def __init__(self, slot: Any, clock: Callable[[], int], thread_id: int | None = None) -> None:
        self._slot = slot
        self._clock = clock
        self._thread = thread_id if thread_id is not None else threading.get_ident()  # the training thread
        # Not known yet under ``watchdog run``: sitecustomize installs the hook before
        # runpy gives ``__main__`` its file. Looked up again at each sample until it is.
        self._main = main_file()
        self._libs = library_dirs()
        self._real: dict[str, str] = {}  # code file name -> real path: one realpath per file, ever
        self.samples = 0
        self.failed: Exception | None = None

    def _realpath(self, name: str) -> str:
        path = self._real.get(name)
        if path is None:
            if len(self._real) > 4096:  # generated code with a new name each time: never grows without bound
                self._real.clear()
            path = self._real[name] = os.path.realpath(name)
        return path

    def poll(self) -> None:
        """Never raises: a sampler that fails once stops sampling (the frame is a
        nicety; the heartbeat it shares a thread with is not)."""
        if self.failed is not None:
            return
        try:
            self._poll()
        except Exception as exc:
            self.failed = exc

    def _poll(self) -> None:
        w = self._slot.words
        now = self._clock()
        steps = w[wire.H_STEP]
        waiting = w[wire.H_COLL_OUTSTANDING] > 0 or w[wire.H_DATA_ENTER_NS] > w[wire.H_DATA_EXIT_NS]
        if not should_sample(steps, now - w[wire.H_STEP_START_NS], w[wire.H_LAST_STEP_NS], waiting):
            return
        if not self._main:
            self._main = main_file()
        frame = sys._current_frames().get(self._thread)  # noqa: SLF001 - CPython API, no public one
        text = user_frame(frame, self._main, self._libs, self._realpath)
        del frame  # hold no reference to the training thread's frames
        if not text:
            return
        put = self._slot.put
        for i, word in enumerate(wire.encode_frame(steps + 1, now, text)):
            put(wire.P_FRAME_STEP + i, word)
        self.samples += 1
