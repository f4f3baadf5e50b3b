"""What a submission returns (`Submission`), and the callable a local run's workers execute."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slurmtrain.common.rundir import RunDir

COMPUTE_ENTRY = "slurmtrain.compute.attempt"  # what srun starts on Slurm: `python -m` this module


@dataclass
class Submission:
    job_id: str
    executor: str
    finished: Optional[bool] = None  # local runs wait: did it reach max_steps?
    exit_code: int = 0


class TrainTask:
    """The picklable callable submitit's LocalExecutor runs on every local task.

    It runs in the worker process, not on the login side: the compute entrypoint is imported there
    by name, and the task's output goes to the same per-rank files srun writes on Slurm
    (logs/<job>_<rank>.out/.err)."""

    def __init__(self, run_dir: str, master_port: Optional[int] = None) -> None:
        self.run_dir, self.master_port = run_dir, master_port

    def __call__(self) -> int:
        job, rank = (
            os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
            os.environ.get("SUBMITIT_LOCAL_GLOBALID"),
        )
        if job is not None and rank is not None:
            logs = RunDir(Path(self.run_dir)).logs
            for fd, suffix in ((1, "out"), (2, "err")):
                sys.stdout.flush() if fd == 1 else sys.stderr.flush()
                target = os.open(
                    logs / f"{job}_{rank}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
                )
                os.dup2(target, fd)
                os.close(target)
        code: int = importlib.import_module(COMPUTE_ENTRY).run(self.run_dir, self.master_port)
        if code:
            raise SystemExit(code)
        return code
