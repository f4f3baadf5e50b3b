"""Export to Hugging Face and sampling, on runs trained here: ZeRO-3 on 2 ranks, ZeRO-2 after a
2 -> 1 world-size change, and a run on a token file made with a local tokenizer folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurmtrain.common.events import Started
from tests.conftest import ROOT, ledger_events, run_cli, run_dirs

FAST = [
    "train.max_steps=8",
    "train.log_interval=1",
    "checkpoint.interval_steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
]


def _cli(args, cwd):
    return run_cli(args, cwd=cwd, module="slurmtrain.cli")


def _export(run: Path, out: Path, *extra: str) -> dict:
    done = _cli(["export", str(run), "--out", str(out), *extra], out.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    meta = json.loads((out / "slurmtrain_export.json").read_text())
    assert meta.get("check", {"ok": True})["ok"], meta
    return meta


def _loads_and_generates(out: Path, vocab: int) -> None:
    from transformers import OPTForCausalLM

    model = OPTForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    assert model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    prompt = torch.tensor([list(b"def ")])
    with torch.no_grad():
        new = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert new.shape == (1, 12) and int(new.max()) < vocab


@pytest.fixture(scope="module")
def z3_run(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("z3")
    done = run_cli(FAST + ["deepspeed=zero3", "name=z3"], cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(work / "runs")
    return run


def test_zero3_two_rank_export_loads_in_transformers_with_the_training_logits(z3_run, tmp_path):
    meta = _export(z3_run, tmp_path / "hf", "--step", "4")
    assert (meta["step"], meta["world_size"], meta["zero_stage"]) == (4, 2, 3)
    check = meta["check"]
    assert check["max_abs_logit_diff"] <= 1e-5
    # Independent of the consolidation code: the loss training logged at step 5 (weights of step
    # 4, global batch of step 4) is what the export computes on that batch.
    assert check["training_loss"]["step"] == 5 and check["training_loss"]["abs_diff"] < 1e-5, check
    print(
        f"zero3 2-rank export: max |logit diff| {check['max_abs_logit_diff']:.1e}, loss vs "
        f"logged {check['training_loss']['abs_diff']:.1e}, {meta['seconds']:.1f} s"
    )
    manifest = z3_run / "checkpoints" / "step_4" / "manifest.json"
    import hashlib

    assert meta["manifest_sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    names = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(names)
    _loads_and_generates(tmp_path / "hf", 512)

    small = _export(z3_run, tmp_path / "sharded", "--max-shard-size", "200KB")  # newest: step 8
    assert small["step"] == 8 and len(small["shards"]) > 1
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    checked = _export(z3_run, tmp_path / "bf16c", "--dtype", "bf16")
    print(
        f"bf16 export: max |logit diff| {checked['check']['max_abs_logit_diff']:.2e} of "
        f"max |logit| {checked['check']['max_abs_logit']:.2f}"
    )

    refused = _cli(["export", str(z3_run), "--out", str(tmp_path / "x"), "--step", "3"], tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "--step=3" in refused.stderr and "step_4" in refused.stderr


def test_sample_prints_text_from_a_run_and_from_its_export(z3_run, tmp_path):
    from_run = _cli(["sample", str(z3_run), "--prompt", "def ", "--tokens", "16"], tmp_path)
    assert from_run.returncode == 0, from_run.stderr
    assert from_run.stdout.startswith("def ") and len(from_run.stdout) > 4
    _export(z3_run, tmp_path / "hf", "--no-verify")
    from_export = _cli(
        ["sample", str(tmp_path / "hf"), "--prompt", "def ", "--tokens", "16"], tmp_path
    )
    assert from_export.returncode == 0, from_export.stderr
    assert from_export.stdout == from_run.stdout  # the same weights (step 8), the same seed
    sampled = _cli(
        [
            "sample",
            str(tmp_path / "hf"),
            "--prompt",
            "def ",
            "--tokens",
            "16",
            "--temperature",
            "0.8",
            "--seed",
            "1",
        ],
        tmp_path,
    )
    assert sampled.returncode == 0 and sampled.stdout.startswith("def ")


def test_zero2_export_after_a_two_to_one_world_size_change(tmp_path):
    args = FAST + ["train.max_steps=12", "deepspeed=zero2", "name=elastic"]
    inject = {"SLURMTRAIN_INJECT": "crash_at_step=6"}
    crashed = run_cli([*args, "faults.allow_inject=true"], cwd=tmp_path, env=inject)
    assert crashed.returncode != 0
    resumed = run_cli(args + ["cluster.cpu_tasks_per_node=1"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    [run] = run_dirs(tmp_path / "runs")
    started = [e for e in ledger_events(run) if isinstance(e, Started)]
    assert [e.world_size for e in started] == [2, 1]
    before = _export(run, tmp_path / "s4", "--step", "4")  # written by 2 ranks
    after = _export(run, tmp_path / "s8", "--step", "8")  # written by 1 rank after the change
    assert (before["world_size"], after["world_size"], after["zero_stage"]) == (2, 1, 2)
    assert after["check"]["training_loss"]["abs_diff"] < 1e-5, after["check"]
    print(
        f"zero2 2->1 export: loss vs logged {before['check']['training_loss']['abs_diff']:.1e} "
        f"(2 ranks), {after['check']['training_loss']['abs_diff']:.1e} (1 rank)"
    )
    _loads_and_generates(tmp_path / "s8", 512)


def test_run_on_a_tokenizer_folder_exports_and_samples_with_it(tmp_path):
    from tests.unit.test_prepare_data import _tiny_tokenizer

    folder = _tiny_tokenizer(tmp_path)
    text = "def add(a, b):\n    return a + b\nthe quick brown fox\n" * 400
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": text[i : i + 300]}) + "\n" for i in range(0, len(text), 300))
    )
    prep = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "prepare_data.py"),
            "--out",
            "c.bin",
            "--tokenizer",
            str(folder),
            "--vocab-size",
            "512",
            "docs.jsonl",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert prep.returncode == 0, prep.stderr
    done = run_cli(
        FAST + ["data=tokens", f"data.path={tmp_path / 'c.bin'}", "data.seq_len=32", "name=tok"],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(tmp_path / "runs")
    meta = _export(run, tmp_path / "hf")
    assert meta["tokenizer"].endswith("c.tokenizer")
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert len(tok) == json.loads((tmp_path / "c.json").read_text())["vocab_size"]
    sampled = _cli(["sample", str(run), "--prompt", "def add", "--tokens", "8"], tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("def add")
