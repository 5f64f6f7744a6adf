"""Dev tooling, kept apart from the contracts (wire, report, commands, evidence):
``watchdog demo`` (``demo``), the real local processes it and the integration
tests start (``localjob``), and one fault scenario run through the demo
(``scenario``).
"""
