"""Dev tooling, kept apart from the contracts (wire, report, commands, evidence):
``watchdog demo`` (``demo``), the real local processes it and the integration
tests start (``localjob``), one fault scenario run through the demo
(``scenario``), and the example training job they all run (``examples/train_ddp.py``,
shipped in the wheel so that the demo works outside a checkout).
"""
