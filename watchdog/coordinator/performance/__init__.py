"""Where the job's time goes: goodput counters, the live bottleneck verdict and when it runs."""
