"""``watchdog doctor``: pre-flight checks of a host before a job.

One check per module behind ``check.Check`` (``check(host) -> Result``), listed
in ``runner.CHECKS``; ``main`` parses the daemons' own flags and environment,
so the doctor looks at what the agent or coordinator will use.
"""
