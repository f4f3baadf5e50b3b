"""Compute-node training parts: model, data, loop, metrics (these import torch)."""
