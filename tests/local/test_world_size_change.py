"""A checkpoint written by 2 ranks resumes on 1 rank through DeepSpeed's universal checkpoint.

The global batch stays 8 (micro 4: grad accumulation 1 on 2 ranks, 2 on 1 rank), so the resumed
run computes the same steps; the only difference is the order of the gradient sums (fp32: ~1e-7).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmtrain.common import checkpoint_format
from slurmtrain.common.events import CheckpointConverted, CheckpointLoaded, Started
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

BASE = [
    "train.max_steps=40",
    "train.log_interval=1",
    "checkpoint.interval_steps=10",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
]


def losses_by_step(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_two_rank_checkpoint_resumes_on_one_rank_with_the_same_losses(stage, workdir):
    args = BASE + [f"deepspeed={stage}"]
    reference = run_cli(args + ["name=reference"], cwd=workdir)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    crashed = run_cli(
        args + ["name=elastic", "faults.allow_inject=true"],
        cwd=workdir,
        env={"SLURMTRAIN_INJECT": "crash_at_step=25"},
    )
    assert crashed.returncode != 0
    resumed = run_cli(args + ["name=elastic", "cluster.cpu_tasks_per_node=1"], cwd=workdir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    found = {path.parent.name: path for path in run_dirs(workdir / "runs")}
    ref_run, run = found["reference"], found["elastic"]
    assert ref_run.name == run.name  # cluster.* is not in the fingerprint: the same run resumed
    assert [e.world_size for e in ledger_of(run, Started)] == [2, 1]
    [converted] = ledger_of(run, CheckpointConverted)
    assert (converted.step, converted.from_world_size, converted.to_world_size) == (
        20,
        2,
        1,
    )
    assert converted.cached is False
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 20 and loaded.world_size_changed is True
    assert loaded.path.endswith("/step_20_universal")
    universal = run / "checkpoints" / "step_20_universal"
    assert checkpoint_format.validate(universal) is None
    assert checkpoint_format.read_manifest(universal)["source"]["step"] == 20
    assert checkpoint_format.read_manifest(run / "checkpoints" / "step_40")["world_size"] == 1

    want, got = losses_by_step(ref_run), losses_by_step(run)
    assert sorted(got) == list(range(1, 41))
    assert all(got[s] == want[s] for s in range(1, 21))  # before the resume: the same 2-rank run
    worst = max(abs(got[s] - want[s]) for s in range(21, 41))
    assert worst <= 1e-5, f"largest loss difference after the resume: {worst:.2e}"
