"""The per-host agent: reads rank slot files, checks rank processes, exports
/metrics and reports to the coordinator. Never imports torch."""
