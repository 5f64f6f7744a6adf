"""The per-job coordinator: cluster view, pure detectors, journal, status API.

Entry points: ``watchdog coordinator`` (``watchdog.coordinator.cli.coordinator``) and
``watchdog status`` (``watchdog.coordinator.cli.status``). Test builders for
users and end-to-end tests live in ``watchdog.coordinator.testing``.
Nothing is imported here, so importing a submodule stays cheap.
"""
