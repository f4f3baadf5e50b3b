"""bench/gpu_check.sh --cpu: the prepared GPU check runs whole on a CPU, so a GPU lease never meets
a broken script. Every measurement is one JSON line, written as it is made."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import ROOT, slurmtrain_env

CHECKS = {
    "device",
    "binding",
    "gemm",
    "n1",
    "throughput",
    "checkpoint_io",
    "resume",
    "bf16_vs_fp32",
}


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
    # Most important first: the N1 check, then throughput, then resume.
    order = [r["check"] for r in rows]
    assert order.index("n1") < order.index("throughput") < order.index("resume")
    # The binding check went through DeepSpeed: the task's one visible device is its device 0.
    assert by_check["binding"]["local_rank"] == "0" and by_check["binding"]["slurm_localid"] == "1"
    # N1: the async save's fp32 partition is the step's, byte for byte, and training moved past it.
    n1 = by_check["n1"]
    assert n1["mode"] == "async" and n1["bytes_differing"] == 0 and n1["fp32_bytes"] > 0
    assert n1["moment_bytes_differing"] == 0  # Adam's moments of the partition too
    assert n1["changed_after_save"] > 0 and n1["copy_threads"]
    # Throughput: both loops timed over the same steps; on shared CPU cores nothing is judged
    # (tests/unit/test_gpu_check_dry.py tests the GPU floors).
    tp = by_check["throughput"]
    assert tp["ours"]["tokens_per_s"] > 0 and tp["bare"]["tokens_per_s"] > 0
    assert tp["ours_over_bare"] > 0 and tp["missed"] == []
    assert set(tp["thresholds"].values()) == {"not judged"}
    assert tp["ours"]["steps_timed"] == tp["bare"]["steps_timed"]
    # The save rate is over the whole save, not the seconds the loop was blocked.
    io = by_check["checkpoint_io"]
    assert io["mode"] == "async" and io["save_total_s"] >= io["save_blocked_s"] > 0
    assert by_check["resume"]["resumed_from"] == by_check["resume"]["paused_at"]
