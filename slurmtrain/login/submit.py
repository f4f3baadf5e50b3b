"""Executors: one way in (`submit(cfg, run)`), each backend in its own module.

The local backend runs the compute-node entrypoint on this machine through submitit's LocalExecutor
and waits, drawing a progress bar; the Slurm backend queues it and returns at once.
"""

from __future__ import annotations

from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.login.submission import Submission


def submit(cfg: RootConfig, run: RunDir) -> Submission:
    # Start-up speed: each backend's imports (submitit, rich, jinja2) only for the one used.
    if cfg.cluster.kind == "local":
        from slurmtrain.login import local_submit

        return local_submit.submit(cfg, run)
    from slurmtrain.login import slurm_submit

    return slurm_submit.submit(cfg, run)
