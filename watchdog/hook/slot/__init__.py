"""Writing this rank's slot: the file and its mapping, the one writer (its seqlock
bracket), the heartbeat thread, and the hook's side of the agent's control block."""
