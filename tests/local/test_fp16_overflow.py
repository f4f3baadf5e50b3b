"""fp16 loss-scale overflows are skipped steps, not divergences: real 2-rank
DeepSpeed fp16 runs on CPU. A loss scale of 2^30 overflows the first gradients, as a large model's
start at DeepSpeed's 2^16 does: DeepSpeed skips those steps and halves the scale until it fits."""

from __future__ import annotations

import math

import pytest
import torch

from slurmtrain.common.events import FailureClass, Finished, Rollback, Stopped
from tests.conftest import ledger_events, read_jsonl, run_cli, run_dirs

FP16 = [
    "deepspeed.dtype=fp16",
    "+deepspeed.extra.fp16.initial_scale_power=30",
    "train.max_steps=20",
    "train.log_interval=1",
    "checkpoint.interval_steps=10",
]
# DeepSpeed trains fp16 on CPUs only where oneDNN has fp16 kernels (AVX512-FP16 / AMX): its
# CPU accelerator's is_fp16_supported; elsewhere it refuses the engine.
pytestmark = pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_fp16_supported(),
    reason="this CPU has no oneDNN fp16 kernels: DeepSpeed refuses fp16 here",
)


def test_overflowing_fp16_steps_are_skipped_and_the_run_finishes(workdir):
    done = run_cli(FP16, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    kinds = [type(e) for e in ledger_events(run)]
    assert Finished in kinds and Rollback not in kinds and Stopped not in kinds
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 21))
    skipped = rows[-1]["skipped_steps"]
    assert 5 <= skipped < 20  # 2^30 -> below 2^16 takes over a dozen halvings, then it trains
    assert math.isfinite(rows[-1]["loss"]) and rows[-1]["loss"] < rows[0]["loss"]


def test_a_sustained_run_of_overflows_is_a_divergence(workdir):
    done = run_cli([*FP16, "faults.max_overflow_steps=3"], cwd=workdir)
    [run] = run_dirs(workdir / "runs")
    [stopped] = [e for e in ledger_events(run) if isinstance(e, Stopped)]
    assert stopped.cls == FailureClass.diverged, done.stdout + done.stderr
    assert "4 fp16 overflow steps in a row" in stopped.error and stopped.step == 4
