"""Step statistics, computed alike by the agent (its step summaries) and the coordinator (its view):
each rank's step history, p99 step time, straggler windows and data share, and the robust
statistics they use. Pure; imports neither the agent nor the coordinator."""
