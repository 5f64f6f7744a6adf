"""The ranks' slot files: listing the run directory, reading each slot, tracking
every rank across polls, and the pure decisions about them (state, staleness, who
speaks for a rank, the GPU-side step split)."""
