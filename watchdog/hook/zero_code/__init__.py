"""Instrumentation the script does not ask for: ``watchdog run`` (run_cli, the
sitecustomize in bootstrap/, auto), and what install() wraps in torch: the
collectives and process-group lifecycle, DDP's comm hook, a restart-safe
``init_process_group``."""
