"""rank-watchdog's in-process hook: what a training rank records about itself.

No code changes: ``watchdog run -- torchrun ... train.py`` instruments every rank
(``watchdog.hook.zero_code.auto``). By hand:

    from watchdog.hook import install
    mon = install()                      # reads RANK/WORLD_SIZE/WATCHDOG_* from the env
    mon.watch_ddp(ddp_model)             # times DDP's gradient all-reduce
    for batch in mon.wrap_loader(loader):
        ...
        mon.step()                       # marks the step boundary

Everything goes into this rank's slot file (``watchdog.contracts.slot``); the hook never
talks to the agent and never reads the slot back, except the control words.

API (``Monitor``; ``NullMonitor`` has the same methods and does nothing):
  step(), step_scope(), wrap_loader(iterable), phase(name),
  collective(op, group=None, nbytes=0), watch_ddp(model, *, hook=None, state=None),
  register_checkpoint(fn), set_step(n), data_wait_begin(), data_wait_end(counted=True),
  close(); errors, status, stats(), slot_path.
Lightning and Transformers callbacks: ``watchdog.hook.lightning``, ``watchdog.hook.hf``.
``current()`` returns the installed monitor (or the no-op one).

Slot contents worth knowing on the reading side:
  * identity ``run_id`` is ``"<TORCHELASTIC_RUN_ID>:<TORCHELASTIC_RESTART_COUNT>"``
    (``rpartition(":")``); ``proc_start_us`` is round(psutil create_time * 1e6).
  * control acks: ``H_CTRL_ACK_RESULT`` is one of ``watchdog.contracts.control_block.ACK_*``
    (0 ok, -1 save raised, -2 rejected, -3 no checkpoint function registered).
  * a CHECKPOINT_AT_STEP for a step already past runs at the next boundary.

Importing this package never imports torch; only the torch features (collective
patching, DDP comm hook, auto step) do, when used. Test helpers for users live in
``watchdog.hook.testing``.

Layout: this folder holds the API (monitor, config, errors, noop, testing) and the
modules users import by path (lightning, hf, rollback); behind it, ``slot/`` writes
the slot, ``marks/`` turns the training thread's events into marks, ``zero_code/``
instruments what the script does not ask for, ``completion/`` learns what the
accelerator and c10d really did, and ``lifecycle/`` is install() and the rank's exit.
"""

from watchdog.hook.config import HookConfig
from watchdog.hook.lifecycle.installer import current, install
from watchdog.hook.monitor import Monitor
from watchdog.hook.noop import NullMonitor

__all__ = ["HookConfig", "Monitor", "NullMonitor", "current", "install"]
