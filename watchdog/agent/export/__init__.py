"""What /metrics exports: the metric definitions, the isolating collector, the
per-rank, per-host and accelerator families, and the NVML sampler behind the last."""
