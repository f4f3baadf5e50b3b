"""The login node: launch (single run, smoke chain, sweep), plan report, submission. Never imports torch."""
