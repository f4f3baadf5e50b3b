"""The recipe in real 2-rank runs: the rate each step trained with is
metaseq's schedule; bf16 with fp32 gradient reduction/accumulation trains under ZeRO 1-3."""

from __future__ import annotations

import math

import pytest

from slurmtrain.common.ds_config import lr_at
from tests.conftest import read_jsonl, run_cli, run_dirs

RUN = ["train.max_steps=20", "train.log_interval=1", "checkpoint.interval_steps=10"]


def test_each_steps_recorded_rate_is_the_schedules(workdir):
    done = run_cli([*RUN, "optim.warmup_steps=5"], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    rows = read_jsonl(run / "metrics.jsonl")
    # opt_tiny's demo recipe: peak 1e-3, floor 1e-4; step 1 trains at peak / 5, never at 0.
    expected = [lr_at(r["step"] - 1, 1e-3, 1e-4, 5, 20) for r in rows]
    assert [r["lr"] for r in rows] == pytest.approx(expected)
    assert rows[0]["lr"] == pytest.approx(2e-4) and rows[-1]["lr"] == pytest.approx(1e-4)


@pytest.mark.parametrize("stage", [1, 3])
def test_bf16_with_fp32_gradient_reduction_trains(workdir, stage):
    done = run_cli([*RUN, f"deepspeed=zero{stage}", "deepspeed.dtype=bf16"], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    rows = read_jsonl(run / "metrics.jsonl")
    assert all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
