"""``watchdog timeline``: the post-mortem of a job from its coordinator journal.

``load.load(path)`` builds a ``model.Timeline`` (one section per coordinator
start and per worker restart; lanes from the ``evidence`` events' slot snapshots,
or the coordinator's last known view when there are none); ``text``, ``html``
and ``perfetto`` render it. Nothing is imported here, so importing a submodule
stays cheap.
"""
