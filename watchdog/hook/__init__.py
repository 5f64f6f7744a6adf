"""rank-watchdog's in-process hook: what a training rank records about itself.

    from watchdog.hook import install
    mon = install()                      # reads RANK/WORLD_SIZE/WATCHDOG_* from the env
    mon.watch_ddp(ddp_model)             # times DDP's gradient all-reduce
    for batch in mon.wrap_loader(loader):
        ...
        mon.step()                       # marks the step boundary

Importing this package never imports torch; only the torch features (collective
patching, DDP comm hook, auto step) do, when used. Test helpers for users live in
``watchdog.hook.testing``.
"""

from watchdog.hook.config import HookConfig
from watchdog.hook.lifecycle import current, install
from watchdog.hook.monitor import Monitor
from watchdog.hook.noop import NullMonitor

__all__ = ["HookConfig", "Monitor", "NullMonitor", "current", "install"]
