"""Observability of a training attempt: metrics lines, throughput/MFU/straggler timers, memory check."""
