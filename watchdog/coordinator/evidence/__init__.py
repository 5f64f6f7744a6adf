"""Evidence: which commands (stacks, Flight Recorder dumps) to ask agents for, their dispatch, and gathering
what comes back."""
