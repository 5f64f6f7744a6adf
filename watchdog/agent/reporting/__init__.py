"""Reports to each job's coordinator: finding it, building the per-host report,
sending it from its own thread, and the step summaries that ride along."""
