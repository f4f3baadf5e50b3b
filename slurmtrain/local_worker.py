"""What each worker of a local run executes: the callable submitit's LocalExecutor pickles.

A local run's login side (login/local_submit.py) hands submitit a `TrainTask`; the worker process
submitit starts unpickles it and calls it, and the call imports and runs the compute entrypoint
(compute/attempt.py, which srun runs as `python -m` on Slurm). This module sits outside both worlds
so that the one place a login-side submission reaches compute code is an import the layout tests
and mypy see, inside the call: importing this module loads nothing of compute/ or torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from slurmtrain.common.rundir import RunDir


class TrainTask:
    """The picklable callable submitit's LocalExecutor runs on every local task.

    Its output goes to the same per-rank files srun writes on Slurm (logs/<job>_<rank>.out/.err)."""

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
        from slurmtrain.compute import attempt  # in the worker: torch and deepspeed load here

        code = attempt.run(self.run_dir, self.master_port)
        if code:
            raise SystemExit(code)
        return code
