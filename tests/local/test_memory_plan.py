"""The planner's per-rank estimate against the measured peak of real tiny CPU runs (within 25%).

Each run trains 3 steps with `train.memory_check_step=3`: PyTorch's profiler sees every CPU tensor
allocation from before the model is built, and the ledger's `memory_checked` holds the largest
rank's peak beside the plan of the same configuration. The cases put different parts on top:
DeepSpeed's whole-bucket gradient buffer (ZeRO-2, ZeRO-3), activations (ZeRO-0, micro batch 16).
"""

from __future__ import annotations

import pytest

from slurmtrain.common.events import MemoryChecked
from tests.conftest import ledger_events, run_cli, run_dirs


@pytest.mark.parametrize(
    "overrides",
    [
        ["deepspeed=zero2"],
        ["deepspeed=zero0", "train.micro_batch_size=16"],
        ["deepspeed=zero3"],
    ],
)
def test_measured_peak_of_a_tiny_cpu_run_is_within_25_percent_of_the_plan(overrides, workdir):
    done = run_cli(["train.max_steps=3", "train.memory_check_step=3", *overrides], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    [check] = [e for e in ledger_events(run) if isinstance(e, MemoryChecked)]
    parts = check.planned_parts
    assert check.planned_bytes == sum(parts.values())  # CPU ranks: no CUDA context on top
    assert check.measured_bytes > 10**6  # a real figure, not an empty profile
    assert 0.75 <= check.measured_bytes / check.planned_bytes <= 1.25, check
