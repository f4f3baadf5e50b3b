"""Executors: one way in (`submit(cfg, run)`), each backend in its own module.

The local backend runs the compute-node entrypoint on this machine through submitit's LocalExecutor
and waits, drawing a progress bar; the Slurm backend queues it and returns at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig

from slurmtrain.common.rundir import RunDir


@dataclass
class Submission:
    job_id: str
    executor: str
    finished: Optional[bool] = None  # local runs wait: did it reach max_steps?
    exit_code: int = 0


class TrainTask:
    """The picklable callable submitit runs on every task: the same entrypoint srun starts."""

    def __init__(self, run_dir: str, master_port: Optional[int] = None) -> None:
        self.run_dir, self.master_port = run_dir, master_port

    def __call__(self) -> int:
        from slurmtrain.compute import attempt as job

        code = job.run(self.run_dir, self.master_port)
        if code:
            raise SystemExit(code)
        return code


def submit(cfg: DictConfig, run: RunDir) -> Submission:
    if cfg.cluster.kind == "local":
        from slurmtrain.login import local_submit as local

        return local.submit(cfg, run)
    from slurmtrain.login import slurm_submit as slurm

    return slurm.submit(cfg, run)
