"""Shared by every world, never imports torch: schema, errors, run directory, ledger, Slurm text and commands."""
