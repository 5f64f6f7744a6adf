"""What the training thread's events become in the slot: the recorder (what each
word and ring record means), step, phase and collective scopes, the timed loader,
collective marks and per-group counters, the framework callbacks' shared rules,
optimizer-step marks, progress counters, the opt-in forward/backward/optimizer split
and the frame of a long step. Everything here writes through ``slot/``."""
