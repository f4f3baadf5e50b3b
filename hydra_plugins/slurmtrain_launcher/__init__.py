"""Hydra launcher for `python -m slurmtrain -m ...`: a sweep becomes ONE Slurm job array."""
