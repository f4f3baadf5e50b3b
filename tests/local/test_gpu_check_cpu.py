"""bench/gpu_check.sh --cpu: the prepared GPU check runs whole on a CPU, so a GPU lease never meets
a broken script. Every measurement is one JSON line, written as it is made."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import ROOT, slurmtrain_env

CHECKS = {"binding", "gemm", "throughput", "slice13b", "checkpoint_io", "resume", "bf16_vs_fp32"}


def test_gpu_check_runs_every_check_on_cpu(tmp_path):
    env = slurmtrain_env({"OUT": str(tmp_path), "PYTHON": ""})
    done = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    rows = [json.loads(x) for x in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    by_check = {r["check"]: r for r in rows}
    assert CHECKS <= set(by_check), (sorted(by_check), done.stderr[-2000:])
    failed = {c: by_check[c] for c in CHECKS if by_check[c].get("ok") is not True}
    assert not failed, failed
    assert done.returncode == 0 and by_check["done"]["ok"] is True
    # The binding check went through DeepSpeed: the task's one visible device is its device 0.
    assert by_check["binding"]["local_rank"] == "0" and by_check["binding"]["slurm_localid"] == "1"
    assert by_check["throughput"]["ours"]["tokens_per_s"] > 0
    assert by_check["resume"]["resumed_from"] == by_check["resume"]["paused_at"]
