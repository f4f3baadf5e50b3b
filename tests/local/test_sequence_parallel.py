"""Sequence parallelism (parallel.sequence=2, DeepSpeed Ulysses) on 2 CPU ranks: SP 2 x DP 1 against
DeepSpeed without SP on one rank (the reference tests/local/test_tensor_parallel.py shares), the
same global batch 8 (micro 2, accumulation 4).

Every logged loss equals the reference's within 1e-5 over 20 steps, and the validation loss (each
SP rank scores its slice of the same held-out windows) equals it. SP keeps ZeRO's checkpoint
layout; its kill-and-resume (and a resume on 4 ranks) were checked by hand (README, TP/SP).
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import PARALLEL_ARGS, read_jsonl, run_cli, run_dirs

ARGS = ["cluster.cpu_tasks_per_node=2", *PARALLEL_ARGS]


def _losses(run: Path, key: str = "loss") -> dict[tuple[int, int], float]:
    rows = read_jsonl(run / "metrics.jsonl")
    return {(r["attempt"], r["step"]): r[key] for r in rows if r.get(key) is not None}


def test_sp2_trains_and_validates_like_sp1(workdir, parallel_reference):
    done = run_cli(ARGS + ["name=sp2", "parallel.sequence=2"], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = " ".join(done.stdout.split())  # the plan's lines wrap at 120 columns
    assert "data-parallel 1 (world 2 / sequence-parallel 2, DeepSpeed Ulysses)" in plan

    ref = parallel_reference
    [run] = run_dirs(workdir / "runs")
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
