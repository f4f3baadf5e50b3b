"""The compute nodes: one process per GPU started by srun; attempt, Trainer, checkpoints, faults, metrics."""
