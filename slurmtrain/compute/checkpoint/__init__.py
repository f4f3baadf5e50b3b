"""Checkpoints: format, manifest, publish and prune; collective save/load; per-rank writer; universal reshape."""
