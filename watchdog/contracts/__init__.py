"""The formats rank-watchdog's parts exchange (slot, report, commands, step summaries, evidence, journal records): pure data and codecs."""
