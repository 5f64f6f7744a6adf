"""What the accelerator and c10d really did, learned off the training thread: GPU
completion times of the collectives (tracker) and PyTorch's Flight Recorder's ring of
every c10d collective (flight_recorder; when to read it: flight_recorder_reads)."""
