"""Sequence parallelism (parallel.sequence=2, DeepSpeed Ulysses) on 2 CPU ranks: SP 2 x DP 1 against
DeepSpeed without SP (one rank), the same global batch 4 (micro 2, accumulation 2).

The SP run is killed in step 12 (a checkpoint at step 10) and resumed: every logged loss equals the
SP=1 run's within 1e-5, the steps trained twice equal the first attempt's (SP keeps ZeRO's
checkpoint layout: the resume loads it as any 2-rank run's), and the validation loss (each SP
rank scores its slice of the same held-out windows) equals SP=1's. Three process starts, ~30 s.
"""

from __future__ import annotations

from pathlib import Path

from slurmtrain.common.events import CheckpointLoaded
from tests.conftest import ledger_events, read_jsonl, run_cli, run_dirs

ARGS = [
    "cluster.cpu_tasks_per_node=2",
    "train.max_steps=20",
    "train.log_interval=1",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "checkpoint.interval_steps=10",
    "data.seq_len=64",  # each SP rank holds 32 tokens of every window
    "data.valid_fraction=0.01",
    "train.eval_interval=10",
]


def _losses(run: Path, key: str = "loss") -> dict[tuple[int, int], float]:
    rows = read_jsonl(run / "metrics.jsonl")
    return {(r["attempt"], r["step"]): r[key] for r in rows if r.get(key) is not None}


def test_sp2_trains_and_resumes_like_sp1(workdir):
    # one rank, accumulation 2: the same global batch as SP 2 x DP 1
    reference = run_cli(ARGS + ["name=sp1", "cluster.cpu_tasks_per_node=1"], cwd=workdir)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    sp = ARGS + ["name=sp2", "parallel.sequence=2"]
    crashed = run_cli(
        sp + ["faults.allow_inject=true"],
        cwd=workdir,
        env={"SLURMTRAIN_INJECT": "crash_at_step=12"},
    )
    assert crashed.returncode != 0
    resumed = run_cli(sp, cwd=workdir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "data-parallel 1 (world 2 / sequence-parallel 2, DeepSpeed Ulysses)" in resumed.stdout

    found = {path.parent.name: path for path in run_dirs(workdir / "runs")}
    ref, run = found["sp1"], found["sp2"]
    want = {step: loss for (_, step), loss in _losses(ref).items()}
    got = _losses(run)
    assert {step for _, step in got} == set(range(1, 21))
    worst = max(abs(loss - want[step]) for (_, step), loss in got.items())
    print(f"SP=2 vs SP=1, 20 steps: largest loss difference {worst:.2e}")
    assert worst <= 1e-5
    valid = {step: v for (_, step), v in _losses(ref, "valid_loss").items()}
    got_valid = _losses(run, "valid_loss")
    assert {step for _, step in got_valid} == {10, 20} == set(valid)
    worst_valid = max(abs(v - valid[step]) for (_, step), v in got_valid.items())
    print(f"SP=2 vs SP=1 validation loss at steps 10, 20: largest difference {worst_valid:.2e}")
    assert worst_valid <= 1e-5
    again = [(step, loss) for (n, step), loss in got.items() if n == 2 and (1, step) in got]
    assert again and all(loss == got[(1, step)] for step, loss in again)  # resumed equal
    [loaded] = [e for e in ledger_events(run) if isinstance(e, CheckpointLoaded)]
    assert loaded.step == 10 and loaded.world_size_changed is False
