"""Fine-tuning from `model.pretrained_path`: a new run starts from an export's weights (ZeRO 2 and
3): its first logged loss (step 1, computed before the first update) is the export's loss on the
same batch; the run's fingerprint carries the source's content checksum."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import read_jsonl, run_cli, run_dirs

TRAIN = [
    "train.max_steps=6",
    "train.log_interval=1",
    "checkpoint.interval_steps=3",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A tiny run trained here (ZeRO-2, 2 ranks) and exported to a Hugging Face folder."""
    work = tmp_path_factory.mktemp("source")
    done = run_cli(TRAIN + ["name=source"], cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(work / "runs")
    out = work / "hf"
    done = run_cli(["export", str(run), "--out", str(out)], cwd=work, module="slurmtrain.cli")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _finetune(work: Path, folder: Path, *extra: str) -> Path:
    args = [
        "name=ft",
        "train.max_steps=1",
        "train.log_interval=1",
        "checkpoint.interval_steps=0",
        "train.global_batch_size=8",
        "train.micro_batch_size=4",
        "data.seed=7",  # another batch than any the source trained on
        f"model.pretrained_path={folder}",
        *extra,
    ]
    done = run_cli(args, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(work / "runs")
    return run


@pytest.mark.parametrize("stage", [2, 3])
def test_finetune_step1_loss_is_the_exports_loss_on_that_batch(export, tmp_path, stage):
    from transformers import OPTForCausalLM

    from slurmtrain.common.schema import load_run_config
    from slurmtrain.compute.export import check_batch
    from slurmtrain.compute.model import loss_fn

    run = _finetune(tmp_path, export, f"deepspeed=zero{stage}")
    [row] = [r for r in read_jsonl(run / "metrics.jsonl") if r["step"] == 1]
    cfg = load_run_config(str(run / "config.yaml"))
    assert cfg.model.pretrained_path == str(export.resolve()) and cfg.model.pretrained_checksum
    exported = OPTForCausalLM.from_pretrained(str(export), local_files_only=True).eval()
    with torch.no_grad():
        want = float(loss_fn(exported, check_batch(cfg, 0, None)))  # step 1 = batch of step 0
    print(f"ZeRO-{stage} fine-tune step-1 loss {row['loss']:.6f} vs export {want:.6f}")
    assert abs(row["loss"] - want) < 1e-5
    # And not what a fresh model would score: the weights really came from the export.
    assert abs(row["loss"] - 6.238) > 0.05  # ln(512): an untrained model's loss


def test_the_sources_content_is_in_the_fingerprint(export, tmp_path):
    from slurmtrain.common import pretrained

    same = tmp_path / "copy"
    shutil.copytree(export, same)
    assert pretrained.checksum(same) == pretrained.checksum(export)  # content, not path or mtime
    weights = next(same.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight: same headers, same size
    weights.write_bytes(bytes(data))
    assert pretrained.checksum(same) != pretrained.checksum(export)


def test_a_source_of_another_shape_is_refused_in_one_line(export, tmp_path):
    done = run_cli(
        [f"model.pretrained_path={export}", "model.hidden_size=32", "dry_run=true"], cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "model.hidden_size=32" in line and "hidden_size=" in line


def test_a_folder_without_weights_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    done = run_cli([f"model.pretrained_path={tmp_path / 'empty'}", "dry_run=true"], cwd=tmp_path)
    assert done.returncode == 2 and "model.pretrained_path=" in done.stderr, done.stderr
