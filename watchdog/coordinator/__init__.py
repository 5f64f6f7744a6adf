"""The per-job coordinator: cluster view, pure detectors, journal, status API.

Entry points: ``watchdog coordinator`` (``watchdog.coordinator.cli.coordinator``) and
``watchdog status`` (``watchdog.coordinator.cli.status``). Test builders for
users and end-to-end tests live in ``watchdog.coordinator.testing``.
Nothing is imported here, so importing a submodule stays cheap.

Rooms, in the order a report goes through them: ``intake`` (HTTP, body parsing,
back-pressure, the status document), ``view`` (the fold of reports, columns),
``analysis`` (health and hang blame shared by detectors), ``detectors`` (one
per module, their runner and tracker), ``performance`` (goodput, the verdict),
``control`` (policy, restart budget, loop breaker, replay from the journal) with
``recovery`` (its destructive actions), ``evidence`` (commands to agents and
what comes back), ``journal`` and ``cli``. ``service.Coordinator`` wires them:
the view, detection, then its ``subsystems`` in tick order (``subsystem.py``);
``daemon.py`` runs it with the clock. Below every room, at the root: the
settings (``config.py``, ``policy_file.py``, ``event_loops.py``), the value sets
the rooms and the metrics share (``vocabularies.py``) and ``metrics.py``; which
room may import which is written down in ``tests/test_import_graph.py``.
"""
