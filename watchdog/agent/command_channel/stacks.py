"""Python stacks of a rank through ``py-spy dump``, for evidence only.

Never periodic: a blocking dump pauses the rank (ptrace) for the few ms it takes
to read its memory, which is fine once for a job that is already stuck. A
*stopped* process (SIGSTOP, state T) cannot be paused again: py-spy 0.4's
blocking dump fails with "Failed to suspend process" (waitpid sees the pending
stop). ``--nonblocking`` reads its memory without attaching, which is exact for a
process that cannot run anyway, and leaves it stopped. So: state T/t ->
``--nonblocking``; a blocking dump that fails because the process got stopped
meanwhile is retried non-blocking, and a failed non-blocking read is tried once more.

py-spy is optional at runtime (``pip install py-spy``, a static binary wheel):
without it a dump is ok=False with an error saying so, never a crash. It needs
ptrace rights over the rank: root or CAP_SYS_PTRACE, or the ranks' own user with
``kernel.yama.ptrace_scope=0``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

from watchdog import procstart
from watchdog.contracts.evidence import StackDump

TIMEOUT_S = 10.0
MAX_TEXT_BYTES = 64 * 1024
BLOCKING, NONBLOCKING = "py-spy dump", "py-spy dump --nonblocking"
_STOPPED = ("T", "t")


def find_py_spy(explicit: str = "") -> str | None:
    """``explicit``, else next to this interpreter (a virtualenv's bin/ is often not
    on PATH for a service), else PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def proc_state(pid: int, proc_root: str = "/proc") -> str | None:
    """The one-letter state from /proc/<pid>/stat (R, S, D, T, t, Z, ...), None if gone."""
    raw = procstart.read_text(f"{proc_root}/{pid}/stat")
    fields = procstart.stat_fields(raw) if raw else []
    return fields[0][:1] if fields else None


def cap_text(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    note = f"\n... [truncated: {len(data)} bytes, kept the first {max_bytes}]\n"
    return data[:max_bytes].decode("utf-8", "ignore") + note


PTRACE_HINT = "py-spy needs ptrace rights: root, CAP_SYS_PTRACE, or the ranks' user with ptrace_scope=0"


def ptrace_denied(pid: int, proc_root: str = "/proc") -> bool:
    """True when this process may not inspect ``pid`` the way py-spy must. Reading
    /proc/<pid>/exe takes the same kernel ptrace access check py-spy's first step
    does; without the right (another user, CAP_SYS_PTRACE dropped, Yama) it fails
    with EACCES, whatever words py-spy's own error uses."""
    try:
        os.readlink(f"{proc_root}/{pid}/exe")
    except PermissionError:
        return True
    except OSError:
        return False  # gone, or a kernel thread: not a rights problem
    return False


def _why(proc: subprocess.CompletedProcess) -> str:
    err = (proc.stderr or proc.stdout or "").split("Stack backtrace:")[0]  # anyhow's backtrace: noise
    lines = [ln for ln in err.splitlines() if ln.strip()][:4]
    msg = " / ".join(ln.strip() for ln in lines)[:500] or f"exit status {proc.returncode}"
    if "ermission" in msg or "not permitted" in msg:
        msg += f" ({PTRACE_HINT})"
    return f"py-spy failed: {msg}"


class StackDumper:
    """One ``dump`` per call, on the caller's thread (the agent's command worker)."""

    def __init__(
        self,
        py_spy: str | None = None,
        *,
        timeout_s: float = TIMEOUT_S,
        max_bytes: int = MAX_TEXT_BYTES,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        state: Callable[[int], str | None] = proc_state,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        denied: Callable[[int], bool] = ptrace_denied,
    ) -> None:
        self.py_spy = py_spy if py_spy is not None else find_py_spy()
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self._run, self._state, self._mono, self._wall, self._denied = run, state, mono, wall, denied

    def dump(self, host: str, rank: int, pid: int, timeout_s: float | None = None) -> StackDump:
        """``timeout_s``: this dump's share of a host-wide deadline (``dumpall``);
        never more than the dumper's own timeout."""
        taken, t0 = self._wall(), self._mono()
        limit = self.timeout_s if timeout_s is None else max(0.001, min(self.timeout_s, timeout_s))
        state = self._state(pid)
        method = NONBLOCKING if state in _STOPPED else BLOCKING

        def out(ok: bool, text: str = "", error: str = "", how: str = method) -> StackDump:
            return StackDump(
                host=host,
                rank=rank,
                pid=pid,
                ok=ok,
                text=text,
                error=error,
                method=how,
                taken_wall=taken,
                duration_s=round(self._mono() - t0, 4),
            )

        if state is None or state == "Z":
            return out(False, error="process gone: no stack to take")
        if not self.py_spy:
            return out(
                False,
                error="py-spy not found: install it on the agent's host (pip install py-spy) or pass --stacks.py-spy",
            )
        ok, text, error = self._once(pid, method, limit)
        left = limit - (self._mono() - t0)
        if not ok and method == BLOCKING and left > 0 and self._state(pid) in _STOPPED:  # stopped while we tried
            method = NONBLOCKING
            ok, text, error = self._once(pid, method, left)
        left = limit - (self._mono() - t0)
        if not ok and method == NONBLOCKING and left > 0 and "timed out" not in error and not self._denied(pid):
            # A read without attaching occasionally misses the interpreter ("Failed to find a python
            # interpreter in the .data section"); a stopped process cannot change, so once more is cheap.
            ok, text, error = self._once(pid, method, left)
        if not ok and PTRACE_HINT not in error and self._denied(pid):  # py-spy's words may not say so
            error = f"no ptrace rights over pid {pid} ({PTRACE_HINT}); {error}"
        return out(ok, cap_text(text, self.max_bytes) if ok else "", error, method)

    def _once(self, pid: int, method: str, timeout_s: float | None = None) -> tuple[bool, str, str]:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        argv = [self.py_spy, "dump", "--pid", str(pid)] + (["--nonblocking"] if method == NONBLOCKING else [])
        try:
            proc = self._run(
                argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, errors="replace"
            )
        except subprocess.TimeoutExpired:  # run() killed it; the kernel detaches a dead tracer
            return False, "", f"py-spy timed out after {timeout_s:.3g} s"
        except OSError as exc:
            return False, "", f"cannot run py-spy ({self.py_spy}): {exc.strerror or exc}"
        if proc.returncode != 0 or not proc.stdout.strip():
            return False, "", _why(proc)
        return True, proc.stdout, ""
