"""The reference pages under docs/reference/, written from the code itself: the
flag tables, the metric specs, the journal's record classes, the slot layout and
the report's field table. ``python -m watchdog.dev.reference`` writes them;
tests/test_reference_docs.py fails when a committed page differs from what the
code renders (``pages.PAGES`` lists them, ``pages.render`` renders one).
"""
