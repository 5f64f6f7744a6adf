"""Progress a rank makes without the script reporting it, and the automatic eval phase.

Real scripts evaluate on rank 0 alone (``model.eval()``, forwards under
``torch.no_grad()``), unmarked, while the other ranks wait in the next gradient
all-reduce. Without a phase that looks like rank 0 never entering the
collective: a hang. What tells the two apart is that an evaluating rank keeps
running forwards, and a hung one (a Python spin, a deadlock, a stuck read) runs
nothing at all.

Counted on the training thread, each a plain attribute increment in a hook,
no slot store, no clock read:

  forwards   torch's global module forward pre-hook, one per module call, split
             by mode: ``train`` (the module in train mode with grad enabled) or
             ``eval`` (eval mode, or under no_grad / inference_mode)
  backwards  ``torch.autograd.backward`` (``loss.backward()`` goes through it)
  optimizer  torch's global optimizer step post-hook

Cost. The optimizer hook and the backward wrapper are one call per step each,
registered at install. A global forward hook is dearer: it sends every module
call through torch's slower ``_call_impl`` path (~1.5 us a module call here,
against ~0.1 us for our counting: benchmarks/hook_overhead.py's forward rows),
so hundreds of microseconds a step for a real model. So the heartbeat thread
registers it only while the step in progress has run much longer than the last
one (``should_arm``: an evaluation, a checkpoint, a hang), and removes it when
a step ends: a job in its steady state never pays for it. The heartbeat may do
that while the training thread runs: torch copies the global pre-hooks into a
tuple before calling them (one C call under the GIL), so a registration can
never change a dict that is being iterated. The optimizer hooks are iterated
lazily (a ``chain`` over dict views): that hook is registered once, at install,
on the training thread. ``WATCHDOG_PROGRESS=0`` registers nothing.

The heartbeat thread copies the counts into the slot's progress words
(wire.P_*) every beat and runs ``decide`` (pure) on what moved since the last
beat. It opens Phase.EVAL by itself when, in one beat, only eval forwards ran
(no train forward, backward, optimizer step or step mark) and no phase is open;
the coordinator then gives the rank the phase allowance its explicit ``eval``
gets. It closes it when the rank comes back to the job (a step ends, it enters
a collective) or stops working: ``stale_s`` with nothing moving (no forward,
backward, optimizer step, step, ring record, collective) outside a data wait.
So an evaluation that ends is never a hang, one that never ends is bounded by
the phase allowance, and a rank that hangs in the middle of one or right after
it (nothing moving) loses the phase after ``stale_s`` and is named as before.
Explicit marks win: the phase opens only when none is open, and it is closed
only while it is the innermost one (a ``torch.save`` inside it nests a
checkpoint phase).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Phase

OPEN, CLOSE, STAY = "open", "close", "stay"
ARM_MIN_NS = 1_000_000_000  # a step in progress this long (and 2x the last) arms the forward hook
ARM_FACTOR = 2
_EVAL, _TRAIN = int(Phase.EVAL), int(Phase.TRAIN)


class Beat(NamedTuple):
    """What the heartbeat reads of the training thread's progress, each beat."""

    train: int  # train-mode forwards with grad enabled
    eval: int  # eval-mode or no-grad forwards
    backward: int
    optimizer: int
    steps: int  # steps the recorder completed
    coll: tuple[int, int]  # (group, seq) of the last collective entered
    ring: int  # step-ring records written (steps, phases, control)
    data: bool  # waiting on the data iterator now


def only_eval(prev: Beat, cur: Beat) -> bool:
    """Eval forwards ran and nothing of a training step did."""
    return (
        cur.eval > prev.eval
        and cur.train == prev.train
        and cur.backward == prev.backward
        and cur.optimizer == prev.optimizer
        and cur.steps == prev.steps
    )


def should_arm(steps: int, step_age_ns: int, last_step_ns: int) -> bool:
    """Count forwards now: the step in progress is much longer than the last.
    Never before the first step ends: a model compiled in its first forward is
    compiled without our hook."""
    return steps > 0 and step_age_ns >= max(ARM_MIN_NS, ARM_FACTOR * last_step_ns)


def decide(
    auto_open: bool, can_open: bool, prev: Beat, cur: Beat, opened: Beat | None, still_ns: int, stale_ns: int
) -> str:
    """OPEN, CLOSE or STAY for the automatic eval phase. ``opened``: the beat
    it was opened at (None while closed); ``still_ns``: how long nothing has
    moved; ``can_open``: no phase is open and the rank is running."""
    if not auto_open:
        return OPEN if can_open and only_eval(prev, cur) else STAY
    if opened is not None and (cur.steps != opened.steps or cur.coll != opened.coll):
        return CLOSE  # back in the job: a step ended, or it entered a collective
    if still_ns >= stale_ns and not cur.data:
        return CLOSE  # stopped working alone: what it does now is not an evaluation
    return STAY


class Counts:
    """The training thread's counters (single writer; the heartbeat reads them)."""

    __slots__ = ("backward", "eval", "optimizer", "train")

    def __init__(self) -> None:
        self.train = self.eval = self.backward = self.optimizer = 0


class Progress:
    """The hooks that count, and the heartbeat's side: slot words and the phase."""

    def __init__(self, recorder: Any, slot: Any, clock: Callable[[], int], stale_s: float) -> None:
        self.counts = Counts()
        self._rec = recorder
        self._slot = slot
        self._clock = clock
        self._stale_ns = int(stale_s * 1e9)
        self._prev: Beat | None = None
        self._opened: Beat | None = None
        self._moved_ns = 0
        self._auto_count = 0
        self._joined_at_step = -1  # the step in which the phase closed on a collective
        self._register_forward: Callable[[], Any] | None = None
        self._forward_handle: Any = None  # the global forward pre-hook, while armed

    # -- training thread: the hooks ----------------------------------------------------

    def install(self, undo: list[Callable[[], None]]) -> None:
        """Register the per-step hooks (optimizer step, backward) now, on the
        training thread; what removes them (and the forward hook, if armed) goes
        on ``undo``. Raises ImportError without torch."""
        import torch
        import torch.autograd
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        c = self.counts
        grad = torch.is_grad_enabled

        def watchdog_forward(module: Any, args: Any) -> None:
            try:  # never raises into training (a try is free in CPython 3.11 until it catches)
                if module.training and grad():
                    c.train += 1
                else:
                    c.eval += 1
            except Exception:
                pass

        def watchdog_optimizer(optimizer: Any, args: Any, kwargs: Any) -> None:
            c.optimizer += 1

        handle = register_optimizer_step_post_hook(watchdog_optimizer)
        undo.append(handle.remove)
        orig = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            c.backward += 1
            return orig(*args, **kwargs)

        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        backward.__doc__, backward.__name__ = orig.__doc__, orig.__name__
        torch.autograd.backward = backward

        def unpatch() -> None:
            if torch.autograd.backward is backward:
                torch.autograd.backward = orig

        undo.append(unpatch)
        undo.append(self._stop)
        self._register_forward = lambda: register_module_forward_pre_hook(watchdog_forward)

    def _arm(self) -> None:
        register = self._register_forward
        if self._forward_handle is None and register is not None:
            self._forward_handle = register()

    def _stop(self) -> None:
        """For good (close): a heartbeat still running must not arm it again."""
        self._register_forward = None
        self._disarm()

    def _disarm(self) -> None:
        handle, self._forward_handle = self._forward_handle, None
        if handle is not None:
            handle.remove()

    def only_auto_open(self) -> bool:
        """The one open phase is the automatic eval (a save inside it nests its checkpoint phase)."""
        return self._opened is not None and self._rec.phase_depth == 1

    # -- heartbeat thread ------------------------------------------------------------

    def beat(self) -> Beat:
        c, w = self.counts, self._slot.words
        return Beat(
            c.train,
            c.eval,
            c.backward,
            c.optimizer,
            self._rec.steps,
            (w[wire.H_COLL_GROUP], w[wire.H_COLL_SEQ]),
            w[wire.H_RING_HEAD],
            w[wire.H_DATA_ENTER_NS] > w[wire.H_DATA_EXIT_NS],
        )

    def poll(self) -> None:
        now = self._clock()
        cur = self.beat()
        prev = self._prev
        if prev is None or cur[:7] != prev[:7]:
            self._moved_ns = now
        if prev is not None:
            self._phase(prev, cur, now)
        self._arming(cur, now)
        self._prev = self.beat() if self._opened is cur else cur  # our own phase record is no move
        put, c = self._slot.put, self.counts
        put(wire.P_TRAIN_FORWARDS, c.train)
        put(wire.P_EVAL_FORWARDS, c.eval)
        put(wire.P_BACKWARDS, c.backward)
        put(wire.P_OPTIMIZER_STEPS, c.optimizer)
        put(wire.P_PROGRESS_NS, self._moved_ns)

    def _arming(self, cur: Beat, now: int) -> None:
        if self._register_forward is None:
            return
        w = self._slot.words
        if self._opened is not None or should_arm(cur.steps, now - w[wire.H_STEP_START_NS], w[wire.H_LAST_STEP_NS]):
            self._arm()
        else:
            self._disarm()

    def _phase(self, prev: Beat, cur: Beat, now: int) -> None:
        rec, slot = self._rec, self._slot
        with slot.lock:  # the training thread opens and closes phases under it too
            # Not again in the step it entered a collective in: ranks that evaluate together
            # (all-reducing metrics per batch) would open and close it every beat.
            can_open = (
                rec.current_phase == _TRAIN
                and not rec.phase_depth
                and rec.status == int(wire.Status.RUNNING)
                and cur.steps != self._joined_at_step
            )
            auto = self._opened is not None
            action = decide(auto, can_open, prev, cur, self._opened, now - self._moved_ns, self._stale_ns)
            if action == OPEN:
                rec.phase_enter(_EVAL)
                self._opened = cur
                self._auto_count += 1
                slot.put(wire.P_AUTO_SINCE_NS, now)
                slot.put(wire.P_AUTO_COUNT, self._auto_count)
                slot.put(wire.P_AUTO_PHASE, _EVAL)
            elif action == CLOSE and rec.current_phase == _EVAL and rec.phase_depth == 1:
                # Closed on a collective within the step it opened in: ranks evaluating together.
                # Steps that ended since say the rank went back to training (seen a beat late, when
                # steps are fast): the step it is in now may be its next evaluation's.
                opened = self._opened
                if opened is not None and cur.coll != opened.coll and cur.steps == opened.steps:
                    self._joined_at_step = cur.steps
                rec.phase_exit()
                self._opened = None
                slot.put(wire.P_AUTO_PHASE, 0)
            elif action == CLOSE and not rec.phase_depth:  # closed under us (the phase API's exit of ours): forget it
                self._opened = None
                slot.put(wire.P_AUTO_PHASE, 0)
