"""Beyond OPT on two CPU ranks: llama_tiny (untied head) and qwen2_tiny (tied, q/k/v
biases) train with activation checkpointing, crash and resume on another world size (DeepSpeed's
universal checkpoint, ZeRO-2), export, and load in transformers with the training model's logits;
an export fine-tunes under ZeRO-3 (transformers' DeepSpeed integration loads it partitioned)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slurmtrain.common.events import Started
from slurmtrain.planning import shapes
from tests.conftest import ledger_events, read_jsonl, run_cli, run_dirs

FAST = [
    "train.max_steps=12",
    "train.log_interval=1",
    "checkpoint.interval_steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "deepspeed=zero2",
    "model.activation_checkpointing=true",
]


def _losses(run: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for row in read_jsonl(run / "metrics.jsonl"):
        if "loss" in row:
            out.setdefault(row["step"], []).append(row["loss"])
    return out


@pytest.mark.parametrize("family", ["llama_tiny", "qwen2_tiny"])
def test_family_trains_resumes_on_another_world_size_and_exports(family, tmp_path):
    args = FAST + [f"model={family}", f"name={family}"]
    crashed = run_cli(
        [*args, "faults.allow_inject=true"],
        cwd=tmp_path,
        env={"SLURMTRAIN_INJECT": "crash_at_step=7"},
    )
    assert crashed.returncode != 0
    resumed = run_cli(args + ["cluster.cpu_tasks_per_node=1"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [run] = run_dirs(tmp_path / "runs")
    started = [e for e in ledger_events(run) if isinstance(e, Started)]
    assert [e.world_size for e in started] == [2, 1]
    losses = _losses(run)
    assert sorted(losses) == list(range(1, 13))
    again = [s for s, v in losses.items() if len(v) == 2]  # computed before the crash and after
    assert again and all(s > 4 for s in again)
    worst = max(abs(losses[s][0] - losses[s][1]) for s in again)
    assert worst <= 1e-5, f"2 -> 1 ranks: largest loss difference {worst:.2e}"
    assert losses[12][-1] < losses[1][0]  # it learns
    rows = read_jsonl(run / "metrics.jsonl")
    assert any(r.get("valid_loss") is not None for r in rows)  # held-out validation ran

    out = tmp_path / "hf"
    done = run_cli(["export", str(run), "--out", str(out)], cwd=tmp_path, module="slurmtrain.cli")
    assert done.returncode == 0, done.stdout + done.stderr
    check = json.loads((out / "slurmtrain_export.json").read_text())["check"]
    assert check["ok"] and check["max_abs_logit_diff"] <= 1e-5, check

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    shape = shapes.shipped()[family]
    assert model.num_parameters() == shapes.param_count(shape)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == shape.tie_embeddings
    with torch.no_grad():
        new = model.generate(torch.tensor([list(b"def ")]), max_new_tokens=6, do_sample=False)
    assert new.shape == (1, 10)

    sampled = run_cli(
        ["sample", str(run), "--prompt", "def ", "--tokens", "8"],
        cwd=tmp_path,
        module="slurmtrain.cli",
    )
    assert sampled.returncode == 0 and sampled.stdout.startswith("def "), sampled.stderr

    if family == "llama_tiny":  # fine-tune the export under ZeRO-3, as a user would
        tune = run_cli(
            [
                "model=llama_tiny",
                f"model.pretrained_path={out}",
                "deepspeed=zero3",
                "train.max_steps=2",
                "train.log_interval=1",
                "train.global_batch_size=8",
                "train.micro_batch_size=4",
                "name=tune",
            ],
            cwd=tmp_path,
        )
        assert tune.returncode == 0, tune.stdout + tune.stderr
        [tuned] = [r for r in run_dirs(tmp_path / "runs") if r.parent.name == "tune"]
        first = _losses(tuned)[1][0]
        assert first < losses[1][0] - 0.5, (first, losses[1][0])  # from the trained weights


def test_readme_your_own_model_commands_run_as_written(tmp_path):
    """README "Your own model": a Llama-shaped config.json in a folder -> dry run -> train (ZeRO-3:
    zero.Init builds the family) -> export -> load in transformers, each exiting 0."""
    import os
    import subprocess
    import sys

    from tests.conftest import slurmtrain_env
    from tests.readme import section_commands

    commands = section_commands("Your own model")
    assert any("dry_run=true" in c for c in commands) and "slurmtrain export" in commands[-2]
    # from a directory outside the checkout, the venv's bin/ first on PATH (as an installed user)
    env = slurmtrain_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    env.pop("SLURMTRAIN_RUNS_ROOT", None)
    env.pop("PYTHONPATH", None)
    outputs = []
    for cmd in commands:
        done = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    planned = outputs[1]
    assert "plan: hf_llama" in planned and "plan: fits" in planned and "MFU" in planned
    assert outputs[-1].startswith("LlamaForCausalLM("), outputs[-1][:200]


@pytest.mark.parametrize("family", ["gemma2", "bloom", "mixtral"])
def test_a_config_json_written_by_transformers_trains_as_a_local_run(family, tmp_path):
    """Issue 33, end to end: `model=hf model.config=DIR` of a config transformers wrote (token ids
    set; gemma2 and bloom on eager attention, bloom's ALiBi planned on data.seq_len, mixtral's
    experts) trains 5 steps as a local job; the job built from the run directory's copy."""
    from tests.local.test_hf_families import tiny_config

    folder = tiny_config(family, tmp_path / "src")
    done = run_cli(
        [
            "model=hf",
            f"model.config={folder}",
            "cluster=local",
            "gpus_per_node=0",
            "cluster.cpu_tasks_per_node=1",
            "data.seq_len=32",
            "train.max_steps=5",
            "train.log_interval=1",
            "train.global_batch_size=4",
            "train.micro_batch_size=4",
            f"name={family}",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    attention = "eager" if family in ("gemma2", "bloom") else "sdpa"
    assert f"attention {attention}" in done.stdout, done.stdout
    [run] = run_dirs(tmp_path / "runs")
    assert (run / "model_config.json").read_text() == (folder / "config.json").read_text()
    assert "oc.env" not in (run / "config.yaml").read_text()
    assert sorted(_losses(run)) == [1, 2, 3, 4, 5]
