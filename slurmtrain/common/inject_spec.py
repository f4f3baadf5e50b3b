"""SLURMTRAIN_INJECT's syntax, `key=value,...`: one parser for the compute nodes' injector
(compute/faults/inject.py, which also needs the run's opt-in) and the batch side's drills
(batch/next_job.py, batch/in_allocation.py: the job script unsets the variable unless the run
opted in, so its presence there is the opt-in)."""

from __future__ import annotations

from typing import Mapping

VARIABLE = "SLURMTRAIN_INJECT"


def parse(env: Mapping[str, str]) -> dict[str, str]:
    text = env.get(VARIABLE, "").strip()
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs}
