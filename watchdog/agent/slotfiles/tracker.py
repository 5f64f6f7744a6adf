"""Scan the run directory, read each slot with ``wire.read_slot`` (pread, never mmap),
and track every slot across polls.

Per poll and per watched slot: one process check (nearly free: see processes/table.py),
then one ``read_slot(path, since)``. Checking the process *before* reading means
the read that follows a
confirmed death shows the rank's final state; after it the slot is frozen and no
longer read (a dead process cannot write), but stays exported until a newer slot
for the same (job, rank) appears or the file is deleted. A torn read keeps the
last good header (only the heartbeat, written outside the seqlock, is taken).

Read errors are counted once per episode (a file entering a bad state for a
reason), not once per poll: a garbage file sitting in the run directory would
otherwise count ten errors a second forever.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from watchdog import logs
from watchdog.agent.processes import deathcause
from watchdog.agent.processes.ownership import parent_identity, process_uids
from watchdog.agent.processes.table import ProcessTable
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.directory import SlotDirectory
from watchdog.agent.slotfiles.listing import CachedLister
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.agent.slotfiles.tracked_slot import TrackedSlot, absorb
from watchdog.contracts import slot as wire

# type: not a regular file (a FIFO would block a reader); link: a symlink (never
# followed); owner: the file's owner is not the owner of the process it names
# (a forgery: pid and start time are public in /proc). record: ring records with
# values no hook writes (counted per record, agent/slotfiles/gpusteps.py), left out of reports.
# job_owner: the file's owner is not the user whose live rank first claimed the job here
# (nor a trusted uid): another user's slot cannot speak for, or hide, someone else's rank.
READ_ERROR_REASONS = ("corrupt", "version", "torn", "io", "type", "link", "owner", "record", "job_owner")
_SETTLED = (
    slot_states.STALE,
    slot_states.OTHER_JOB,
    slot_states.EXPIRED,
)  # skipped files not read again while their inode lasts
_NOT_AGAIN = (*_SETTLED, "owner", "job_owner")  # a forged owner does not change while the inode lasts either
_PENDING = "pending"  # a brand-new file that does not parse yet
NEW_FILE_GRACE_NS = 2_000_000_000
EXPIRY_CHECK_NS = 1_000_000_000  # abandoned jobs are looked for once a second, not every poll


def _rank_key(s: TrackedSlot) -> tuple[str, int]:
    return (s.header.identity.job, s.header.identity.rank)


def _claim(s: TrackedSlot) -> slot_states.Claim:
    h = s.header
    return slot_states.Claim(s.first_seen, s.seen_alive, s.proc.alive, (h.created_wall_ns, h.created_mono_ns), s.path)


class SlotTracker:
    def __init__(
        self,
        run_dir: str,
        *,
        job: str = "",
        stale_after_s: float = 30.0,
        job_expiry_s: float = 900.0,
        procs: ProcessTable | None = None,
        read: Callable = wire.read_slot,
        lister: Callable[[str, int], dict[str, int]] | None = None,
        resource_interval_s: float = 1.0,
        stat: Callable = os.lstat,
        log: Any = None,
        parent: Callable[[int], tuple[int, int]] | None = None,
        owner: Callable[[int], frozenset[int] | None] | None = None,
        trusted_uids: frozenset[int] = frozenset(),
        check_dir: Callable[[str], str] | None = None,
        death_causes: bool = True,
    ) -> None:
        self.run_dir, self.job, self.stale_after_s, self.job_expiry_s = run_dir, job, stale_after_s, job_expiry_s
        self._next_expiry_ns = 0
        self._stat = stat
        self._parent = parent or parent_identity
        self._owner = owner or process_uids
        self._trusted = frozenset(trusted_uids)
        self._causes = death_causes  # off: no /proc, cgroup or kernel-log reads at a death (tests with fakes)
        self.procs = procs or ProcessTable()
        self._read = read
        self._resource_ns = int(resource_interval_s * 1e9)
        self._log = log or logs.get("watchdog.agent.slots")
        self._dir = SlotDirectory(
            run_dir, lister=lister or CachedLister(), check_dir=check_dir, trusted=self._trusted, log=self._log
        )
        self._lock = threading.Lock()
        self._slots: dict[str, TrackedSlot] = {}
        self._job_uid: dict[str, int] = {}  # job -> uid of its first live rank here (slot_states.job_owner)
        self._skipped: dict[str, tuple[int, str]] = {}  # path -> (inode, STALE / OTHER_JOB / INVALID reason)
        self._entries_seen: dict[str, int] | None = None
        self._membership_changed = False  # slots added or removed: who speaks for a rank may change
        self._crashed: set[str] = set()  # paths whose processing raised (logged once each)
        self.read_errors = dict.fromkeys(READ_ERROR_REASONS, 0)
        self.polls = 0

    # -- the poll ------------------------------------------------------------

    def poll(self, now_mono_ns: int, now_wall_ns: int) -> None:
        entries = self._dir.entries(now_mono_ns)
        with self._lock:
            self.polls += 1
            self.procs.refresh()
            if entries is not self._entries_seen:  # the lister hands back the same dict when nothing changed
                self._entries_seen = entries
                for path in [p for p, s in self._slots.items() if entries.get(p) != s.inode]:
                    self._forget(path)
                for path in [p for p, (ino, _) in self._skipped.items() if entries.get(p) != ino]:
                    del self._skipped[path]
            for path, inode in entries.items():
                try:
                    slot = self._slots.get(path)
                    if slot is None:
                        if path not in self._skipped or self._skipped[path][1] not in _NOT_AGAIN:
                            self._first_sight(path, inode, now_mono_ns, now_wall_ns)
                    elif not (slot.final or slot.superseded):
                        self._update(slot, now_mono_ns)
                except Exception as exc:  # a bug on one slot must not starve the others of polls
                    if path not in self._crashed:
                        self._crashed.add(path)
                        self._log.error("slot poll failed", path=path, error=repr(exc), exc_info=exc)
            if now_mono_ns >= self._next_expiry_ns:
                self._next_expiry_ns = now_mono_ns + EXPIRY_CHECK_NS
                self._expire(now_mono_ns)
            if self._membership_changed:
                self._membership_changed = False
                self._resolve()
            self._dir.check_empty(now_mono_ns, len(entries), len(self._slots), self._counts_locked)

    def _read_or_count(
        self, path: str, since: int, current_error: str, events_since: int = 0
    ) -> wire.SlotSnapshot | str | None:
        """The snapshot, or the error reason, or None when the file vanished."""
        try:
            return self._read(path, since, events_since) if events_since else self._read(path, since)
        except FileNotFoundError:  # deleted between listdir and open: not an error
            return None
        except (wire.SlotError, OSError) as exc:
            reason = exc.reason if isinstance(exc, wire.SlotError) else "io"
            if reason != current_error:
                self.read_errors[reason] = self.read_errors.get(reason, 0) + 1
                self._log.warning("slot rejected", path=path, reason=reason, error=str(exc))
            return reason

    def _first_sight(self, path: str, inode: int, now_mono_ns: int, now_wall_ns: int) -> None:
        prev_error = self._skipped.get(path, (0, ""))[1]
        if prev_error in ("", _PENDING) and self._being_formatted(path, now_wall_ns):
            prev_error = "corrupt"  # a file still being formatted: neither an error nor a log line
            pending = True
        else:
            pending = False
        snap = self._read_or_count(path, 0, prev_error)
        if snap is None:
            self._skipped.pop(path, None)
            return
        if isinstance(snap, str):
            self._skipped[path] = (inode, _PENDING if pending and snap == "corrupt" else snap)
            return
        self._skipped.pop(path, None)
        ident = snap.header.identity
        if self.job and ident.job != self.job:
            self._skipped[path] = (inode, slot_states.OTHER_JOB)
            return
        proc = self.procs.check(
            ident.pid, ident.proc_start_us, now_mono_ns, resources=True, start_ticks=ident.proc_start_ticks
        )
        if proc.alive and not self._owned_by_its_process(path, inode, snap, prev_error):
            self.procs.forget(ident.pid, ident.proc_start_us)
            return
        if not self._admitted(path, inode, snap, proc.alive, prev_error):
            self.procs.forget(ident.pid, ident.proc_start_us)
            return
        reason = slot_states.stale_reason(snap.header, proc, now_mono_ns, now_wall_ns, self.stale_after_s)
        if reason:
            self._skipped[path] = (inode, slot_states.STALE)
            self.procs.forget(ident.pid, ident.proc_start_us)
            self._log.info("slot stale", path=path, job=ident.job, rank=ident.rank, pid=ident.pid, reason=reason)
            return
        if proc.alive and ident.proc_start_ticks:  # believed: its own start reading is the one checked from now on
            self.procs.vouch(ident.pid, ident.proc_start_us, ident.proc_start_ticks)
        here = self.procs.host_pid(ident.pid, ident.proc_start_us)
        slot = TrackedSlot(
            path=path,
            inode=snap.inode or inode,
            snap=snap,
            status=snap.header.status,
            heartbeat_ns=snap.header.heartbeat_ns,
            proc=proc,
            res_prev=proc,
            launcher=self._parent(here) if proc.alive else (0, 0),
            host_pid=here if here != ident.pid else 0,
            uid=snap.uid,
            oom=deathcause.OomBaseline.read(here) if proc.alive and self._causes else None,
            first_seen=self.polls,
            seen_alive=proc.alive,
        )
        absorb(slot, snap, self.read_errors, self._log)
        slot.state = slot_states.rank_state(slot.status, proc)
        self._slots[path] = slot
        self._membership_changed = True
        self._claim_job(ident.job, snap.uid, proc.alive)
        self._log.info(
            "rank appeared",
            job=ident.job,
            rank=ident.rank,
            pid=ident.pid,
            state=slot.state,
            proc_status=proc.status,
            path=path,
            **({"host_pid": here} if slot.host_pid else {}),
        )

    def _owned_by_its_process(self, path: str, inode: int, snap: wire.SlotSnapshot, prev_error: str) -> bool:
        """A slot names a process by pid and start time, both public in /proc: anyone
        who can create a file here could name any process. Believe it only if the
        file belongs to that process's user (or to a configured training uid).
        Checked while the process lives; a slot whose process is already gone at
        first sight cannot be checked, and is reported dead but never acted on (an
        action needs a live process, whose slot was checked when it registered)."""
        if snap.uid < 0 or snap.uid in self._trusted:
            return True
        here = self.procs.host_pid(snap.header.identity.pid, snap.header.identity.proc_start_us)
        uids = self._owner(here)
        if uids is None:  # alive but unreadable (hidepid, a sandbox): only our own files or root's
            uids = frozenset({os.geteuid(), 0})
        if snap.uid in uids:
            return True
        ident = snap.header.identity
        if prev_error != "owner":
            self.read_errors["owner"] += 1
            self._log.warning(
                "slot refused",
                path=path,
                reason="owner",
                job=ident.job,
                rank=ident.rank,
                pid=ident.pid,
                file_uid=snap.uid,
                process_uids=sorted(uids),
                detail="the file's owner is not the user of the process it names: a forged "
                "identity; the file is ignored (see --slots.trusted-uids)",
            )
        self._skipped[path] = (inode, "owner")
        return False

    def _admitted(self, path: str, inode: int, snap: wire.SlotSnapshot, alive: bool, prev_error: str) -> bool:
        """A job's ranks on this host belong to the user of its first live rank (or to
        a trusted uid): a slot of another user for that job is refused whatever pid it
        names, dead or alive. A dead slot of a job no live rank claimed yet is taken
        (it cannot be acted on); it goes when a live rank of another user claims the job."""
        job = snap.header.identity.job
        owner = self._job_uid.get(job)
        if slot_states.job_admits(owner, snap.uid, self._trusted):
            return True
        self._refuse_for_job(path, inode, snap.header.identity, snap.uid, owner, count=prev_error != "job_owner")
        return False

    def _claim_job(self, job: str, uid: int, alive: bool) -> None:
        owner = self._job_uid.get(job)
        new = slot_states.job_owner(owner, uid, alive, self._trusted)
        if new is None or new == owner:
            return
        self._job_uid[job] = new
        self._log.info("job owner", job=job, uid=new)
        for path, s in list(self._slots.items()):  # dead slots taken before the job had an owner
            if s.header.identity.job == job and not slot_states.job_admits(new, s.uid, self._trusted):
                del self._slots[path]
                self.procs.forget(s.header.identity.pid, s.header.identity.proc_start_us)
                self._refuse_for_job(path, s.inode, s.header.identity, s.uid, new, count=True)

    def _refuse_for_job(
        self, path: str, inode: int, ident: wire.Identity, uid: int, owner: int | None, *, count: bool
    ) -> None:
        if count:
            self.read_errors["job_owner"] += 1
            self._log.warning(
                "slot refused",
                path=path,
                reason="job_owner",
                job=ident.job,
                rank=ident.rank,
                pid=ident.pid,
                file_uid=uid,
                job_uid=owner,
                detail="the job's ranks on this host belong to another user: a slot of this user cannot speak "
                "for them; the file is ignored (see --slots.trusted-uids)",
            )
        self._skipped[path] = (inode, "job_owner")
        self._membership_changed = True

    def _release_jobs(self) -> None:
        """A job with no slot left here has no owner: its name may be used again."""
        live_jobs = {s.header.identity.job for s in self._slots.values()}
        for job in [j for j in self._job_uid if j not in live_jobs]:
            del self._job_uid[job]

    def _being_formatted(self, path: str, now_wall_ns: int) -> bool:
        """The hook creates its file in place (create, allocate, format, magic last):
        for a moment it is empty or zeros, which reads as corrupt."""
        try:
            return now_wall_ns - self._stat(path).st_mtime_ns < NEW_FILE_GRACE_NS
        except OSError:
            return False

    def _update(self, slot: TrackedSlot, now_ns: int) -> None:
        # The hot path: every watched rank, every poll. Keep it lean.
        ident, prev = slot.header.identity, slot.proc
        resources = now_ns - prev.sampled_ns >= self._resource_ns
        proc = self.procs.check(
            ident.pid, ident.proc_start_us, now_ns, resources=resources, start_ticks=ident.proc_start_ticks
        )
        snap = self._read_or_count(slot.path, slot.since, slot.error, slot.events_since)
        if snap is None:  # deleted since the (possibly cached) listing
            self._forget(slot.path)
            return
        if not isinstance(snap, str) and snap.inode and snap.inode != slot.inode:
            self._forget(slot.path)  # replaced since it was validated: seen afresh on the next poll
            return
        if isinstance(snap, str):
            slot.error = snap  # keep the last good state
        else:
            slot.error = ""
            absorb(slot, snap, self.read_errors, self._log)
        if proc is not prev:  # the process table hands back the same sample when nothing was read
            if resources and proc.alive:
                slot.cpu_pct, slot.res_prev = slot_states.cpu_percent(slot.res_prev, proc), proc
                slot.runq.append(proc)
                while proc.sampled_ns - slot.runq[0].sampled_ns > slot_states.RUNQ_WINDOW_S * 1e9:
                    slot.runq.popleft()
                slot.oncpu_share, slot.runq_share = slot_states.runq_shares(slot.runq)
            if proc.stopped != prev.stopped:
                self._log.info(
                    "rank stopped" if proc.stopped else "rank resumed", job=ident.job, rank=ident.rank, pid=ident.pid
                )
            slot.proc = proc
        # Gone after its hook said "exited": the exit status decides (a nonzero one is a failure).
        code = self._exit_code(slot) if not proc.alive and slot.status == wire.Status.EXITED else None
        state = slot_states.rank_state(slot.status, proc, code)
        if slot.status == wire.Status.FAILED and proc.alive and not slot.death and self._causes:
            # Crashing but not gone yet (interpreter shutdown, a process group's teardown can
            # take seconds): its heartbeat stops now, so say why before it is called frozen.
            slot.death = deathcause.explain(wait_status=None, hook_status="failed", slot_path=slot.path)
        if state != slot.state:
            event = {slot_states.DEAD: "rank died", slot_states.EXITED: "rank exited"}.get(state, "rank alive")
            if state == slot_states.DEAD:
                slot.died_here = slot.state == slot_states.ALIVE
                if self._causes:
                    slot.death = self._death(slot)
            self._log.info(
                event,
                job=ident.job,
                rank=ident.rank,
                pid=ident.pid,
                proc_status=proc.status,
                step=slot.header[wire.H_STEP],
                path=slot.path,
                **({"cause": slot.death["summary"]} if "summary" in slot.death else {}),
            )
            slot.state = state
            self._membership_changed = True  # a live slot died: one never seen alive may now speak
        # Read after the process was seen gone: that read was its final state.
        slot.final = not proc.alive and not isinstance(snap, str)

    def _exit_code(self, slot: TrackedSlot) -> int | None:
        """The exit code of a rank gone after a clean-looking exit, where this host
        read it (deathcause.decode's convention); None: not read."""
        exit_status = getattr(self.procs, "exit_status", None)
        if not self._causes or exit_status is None:
            return None
        ident = slot.header.identity
        try:
            status = exit_status(ident.pid, ident.proc_start_us)
        except Exception:  # a detail of the post-mortem, never the poll
            return None
        return None if status is None else deathcause.decode(status)[0]

    def _death(self, slot: TrackedSlot) -> dict:
        """Why it died, read once at the death (after the slot's final read)."""
        ident = slot.header.identity
        try:
            exit_status = getattr(self.procs, "exit_status", None)
            return deathcause.explain(
                wait_status=exit_status(ident.pid, ident.proc_start_us) if exit_status else None,
                hook_status=slot_states.label(wire.Status, slot.status, "unknown"),
                slot_path=slot.path,
                oom=slot.oom,
                host_pid=slot.host_pid or ident.pid,
            )
        except Exception as exc:  # a detail of the post-mortem, never the poll
            self._log.warning("death cause unreadable", rank=ident.rank, pid=ident.pid, error=str(exc))
            return {}

    def _resolve(self) -> None:
        self._release_jobs()
        winners = set(map(id, slot_states.speakers(self._slots.values(), _rank_key, _claim).values()))
        for slot in self._slots.values():
            now_superseded = id(slot) not in winners
            if now_superseded and not slot.superseded:
                ident = slot.header.identity
                self._log.info("slot superseded", job=ident.job, rank=ident.rank, pid=ident.pid, path=slot.path)
            slot.superseded = now_superseded

    def _expire(self, now_mono_ns: int) -> None:
        """Stop exporting the slots of jobs whose processes here all ended long ago.
        The files stay (a post-mortem may want them); they are not read again."""
        expired = slot_states.expired_jobs(
            ((s.header.identity.job, s.proc) for s in self._slots.values()), now_mono_ns, self.job_expiry_s
        )
        for job, gone_for_s in expired.items():
            paths = sorted(p for p, s in self._slots.items() if s.header.identity.job == job)
            for path in paths:
                slot = self._slots.pop(path)
                self._skipped[path] = (slot.inode, slot_states.EXPIRED)
                ident = slot.header.identity
                self.procs.forget(ident.pid, ident.proc_start_us)
            self._membership_changed = True
            self._log.warning(
                "job expired",
                job=job,
                slots=len(paths),
                gone_for_s=round(gone_for_s),
                after_s=self.job_expiry_s,
                detail="every process of this job on this host ended longer ago than --stale.job-expiry-seconds: "
                "its ranks are no longer exported (their rank-dead alerts resolve); the slot files stay "
                "for post-mortems, delete them to clean up",
                run_dir=self.run_dir,
            )

    def _forget(self, path: str) -> None:
        slot = self._slots.pop(path)
        self._membership_changed = True
        ident = slot.header.identity
        self.procs.forget(ident.pid, ident.proc_start_us)
        self._log.info("slot removed", job=ident.job, rank=ident.rank, pid=ident.pid, path=path)

    # -- what others see -----------------------------------------------------

    def views(self) -> tuple[LocalRank, ...]:
        """The ranks to export: one per (job, rank), sorted."""
        with self._lock:
            out = [self._local(s) for s in self._slots.values() if not s.superseded]
        return tuple(sorted(out, key=lambda v: (v.identity.job, v.identity.rank)))

    def replaced_deaths(self) -> tuple[LocalRank, ...]:
        """Dead incarnations a newer one has replaced: a rank that died and was
        restarted (torchrun restarts its group within a second) between two reports
        was never seen dead by the coordinator; the sender tells it once."""
        with self._lock:
            # Only deaths seen happen: a restarted agent finds earlier incarnations dead,
            # which the coordinator knew of before (and a stale one would be news to it).
            return tuple(
                self._local(s)
                for s in self._slots.values()
                if s.superseded and s.state == slot_states.DEAD and s.died_here
            )

    def incarnations(self, job: str) -> tuple[LocalRank, ...]:
        """Every tracked slot of ``job``, superseded and dead ones included: evidence
        is about the process a finding named, which may have been replaced since."""
        with self._lock:
            return tuple(self._local(s) for s in self._slots.values() if s.header.identity.job == job)

    @staticmethod
    def _local(s: TrackedSlot) -> LocalRank:
        return LocalRank(
            s.path,
            s.header,
            s.heartbeat_ns,
            s.torn,
            s.proc,
            s.state,
            s.cpu_pct,
            tuple(s.steps),
            s.launcher,
            s.host_pid,
            s.uid,
            s.inode,
            s.death,
            tuple(s.colls),
            tuple(s.ev_colls),
            tuple(s.gpu),
            "gpu" if s.gpu_fold is not None and s.gpu_fold.last_step >= 0 else "",
            s.gpu_fold.totals_ns if s.gpu_fold is not None else (0, 0, 0),
            not s.superseded,
            oncpu_share=s.oncpu_share,
            runq_share=s.runq_share,
        )

    def state_counts(self) -> dict[str, int]:
        with self._lock:
            return self._counts_locked()

    def _counts_locked(self) -> dict[str, int]:
        counts = dict.fromkeys(slot_states.SLOT_STATES, 0)
        for s in self._slots.values():
            counts[slot_states.SUPERSEDED if s.superseded else s.state] += 1
        for _, why in self._skipped.values():
            if why != _PENDING:
                counts[why if why in _SETTLED else slot_states.INVALID] += 1
        return counts
