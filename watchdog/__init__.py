"""rank-watchdog: fault monitor for distributed PyTorch jobs.

Deliberately empty. The PyPI filesystem library ``watchdog`` shares this import
name; keeping nothing here lets both coexist in one environment. The public API
lives in submodules: ``watchdog.hook`` (inside training ranks), ``watchdog.agent``
(per host), ``watchdog.wire`` (slot file layout).
"""
