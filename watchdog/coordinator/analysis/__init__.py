"""Analyses over the view that several detectors share: rank health and hang blame (Flight Recorder, mismatches,
silent hosts, wedges), intermittent stalls and slow causes."""
