"""``watchdog scaling``: the measured scaling curve of one job from the journals
of its runs at several world sizes (runs.py reads and computes, render.py draws,
main.py is the command)."""
