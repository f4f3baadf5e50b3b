"""Login-node command-line tools: status, logs, report, doctor (no torch at import time)."""
