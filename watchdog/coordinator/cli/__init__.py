"""The coordinator's commands: ``watchdog coordinator``, ``watchdog status``, ``watchdog hosts``."""
