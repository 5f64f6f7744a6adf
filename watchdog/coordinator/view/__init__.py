"""The cluster view: the pure fold of host reports, the per-rank columns and step statistics every analysis reads."""
