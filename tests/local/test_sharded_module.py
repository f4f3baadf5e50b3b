"""Under ZeRO-1/2 every rank writes its share: no rank writes the full module weights.

DeepSpeed has rank 0 write `mp_rank_00_model_states.pt` with the whole module (26 GB for opt13b),
redundant with the fp32 partitions every rank writes. A ZeRO-2 2-rank run here: its model-states
file holds no parameter bytes (buffers and metadata only), it resumes bitwise-equal on 2 ranks,
resumes on 1 rank (universal conversion), exports to Hugging Face and samples.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from slurmtrain.common.events import CheckpointLoaded, Started
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

BASE = [
    "deepspeed=zero2",
    "train.max_steps=12",
    "train.log_interval=1",
    "checkpoint.interval_steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
]


def losses(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted run; the same run crashed at step 6, resumed from step_4 on 2 ranks and,
    crashed again the same way, on 1 rank."""
    work = tmp_path_factory.mktemp("sharded")
    found: dict[str, Path] = {}
    for name, tasks in (("reference", None), ("resumed", 2), ("elastic", 1)):
        args = BASE + [f"name={name}"]
        if tasks is not None:
            inject = {"SLURMTRAIN_INJECT": "crash_at_step=6"}
            crashed = run_cli([*args, "faults.allow_inject=true"], cwd=work, env=inject)
            assert crashed.returncode != 0
            [run] = [p for p in run_dirs(work / "runs") if p.parent.name == name]
            if name == "resumed":  # as saved, before the resume's own saves prune it
                shutil.copytree(run / "checkpoints" / "step_4", work / "step_4_as_saved")
            args += [f"cluster.cpu_tasks_per_node={tasks}"]
        done = run_cli(args, cwd=work)
        assert done.returncode == 0, done.stdout + done.stderr
        [found[name]] = [p for p in run_dirs(work / "runs") if p.parent.name == name]
    return {**found, "saved": work / "step_4_as_saved"}


def _param_bytes(directory: Path) -> int:
    shapes = torch.load(directory / "mp_rank_00_model_states.pt", weights_only=False)
    return sum(4 * s.numel() for group in shapes["param_shapes"] for s in group.values())


def test_model_states_file_holds_no_module_weights(runs):
    saved = runs["saved"]
    states = torch.load(saved / "mp_rank_00_model_states.pt", weights_only=False)
    params = {n for group in states["param_shapes"] for n in group}
    in_module = {n for n, t in states["module"].items() if isinstance(t, torch.Tensor)}
    assert not (in_module & params), sorted(in_module & params)[:5]
    assert not (in_module & set(states["shared_params"] or {}))  # the tied head neither
    assert set(states["module"]) <= set(states["buffer_names"]) | set(
        states.get("frozen_param_fragments") or {}
    )
    size = (saved / "mp_rank_00_model_states.pt").stat().st_size
    partitions = sum(p.stat().st_size for p in saved.glob("*_optim_states.pt"))
    # fp32 weights are 1/3 of the partitions (Adam: 2 moments); the module would add that again
    assert size < _param_bytes(saved) / 10 < partitions, (size, _param_bytes(saved), partitions)
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["files"]["mp_rank_00_model_states.pt"]["size"] == size


def test_resume_from_partitions_only_is_bitwise_equal(runs):
    run, reference = runs["resumed"], runs["reference"]
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 4 and loaded.path.endswith("/step_4")
    assert losses(run) == losses(reference)  # fp32 on CPU: bitwise


def test_two_to_one_world_size_change_from_it(runs):
    run = runs["elastic"]
    assert [e.world_size for e in ledger_of(run, Started)] == [2, 1]
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.world_size_changed is True and loaded.path.endswith("/step_4_universal")
    want, got = losses(runs["reference"]), losses(run)
    assert sorted(got) == list(range(1, 13))
    worst = max(abs(got[s] - want[s]) for s in range(5, 13))
    assert worst <= 1e-5, f"largest loss difference after the 2 -> 1 resume: {worst:.2e}"


def test_export_and_sample_from_it(runs, tmp_path):
    run = runs["resumed"]
    out = tmp_path / "hf"
    done = run_cli(
        ["export", str(run), "--out", str(out), "--step", "12"],
        cwd=tmp_path,
        module="slurmtrain.cli",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    meta = json.loads((out / "slurmtrain_export.json").read_text())
    assert meta["check"]["ok"] and meta["check"]["max_abs_logit_diff"] <= 1e-5, meta["check"]
    done = run_cli(
        ["sample", str(run), "--prompt", "def ", "--tokens", "8"],
        cwd=tmp_path,
        module="slurmtrain.cli",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("def "), done.stdout
