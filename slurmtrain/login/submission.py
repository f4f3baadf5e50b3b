"""What a submission returns; a local run's workers run slurmtrain/local_worker.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Submission:
    job_id: str
    executor: str
    finished: Optional[bool] = None  # local runs wait: did it reach max_steps?
    exit_code: int = 0
