"""The coordinator's signed commands on this host: verifying and queueing them
(inbox), what each does (handlers: stack and Flight Recorder dumps, signals,
checkpoint requests), and their acks waiting for the next report (outbox)."""
