"""Validation and blends end to end on this machine: valid_loss falls in the demo run and shows in
metrics.jsonl, TensorBoard and `status`; a blend of two token files trains, its checkpoints record
the samples drawn from each source."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

from slurmtrain.common.events import CheckpointSaved
from tests.conftest import ROOT, ledger_events, read_jsonl, run_cli, run_dirs


def test_valid_loss_falls_in_the_demo_run_and_shows_in_metrics_tensorboard_and_status(workdir):
    done = run_cli(
        ["train.max_steps=100", "train.eval_interval=25", "checkpoint.interval_steps=50"],
        cwd=workdir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "valid_loss" in r]
    assert [r["step"] for r in rows] == [25, 50, 75, 100]
    losses = [r["valid_loss"] for r in rows]
    assert losses[-1] < 0.9 * losses[0], losses
    assert all(
        abs(r["valid_ppl"] - 2.718281828 ** r["valid_loss"]) < 1e-6 * r["valid_ppl"] for r in rows
    )
    assert all("loss" in r and "tokens_per_s" in r for r in rows)  # the step's own row
    [events] = list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert b"valid_loss" in events.read_bytes() and b"valid_ppl" in events.read_bytes()
    status = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert json.loads(status.stdout)["valid_loss"] == losses[-1]
    table = run_cli(["status", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert "valid_loss" in table.stdout and f"{losses[-1]:.4f}" in table.stdout
    # the demo ends with the two commands to use what it trained
    assert f"python -m slurmtrain.cli sample {run}" in done.stdout
    assert f"python -m slurmtrain.cli export {run}" in done.stdout


def _prepare(out: Path, files: list[Path]) -> Path:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "prepare_data.py"),
            "--out",
            str(out),
            *map(str, files),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_a_blend_trains_and_every_checkpoint_records_samples_per_source(workdir):
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    a = _prepare(workdir / "a.bin", stdlib[:20])
    b = _prepare(workdir / "b.bin", stdlib[20:30])
    sources = f"data.sources=[{{path:{a},weight:0.7}},{{path:{b},weight:0.3}}]"
    args = ["data=blend", sources, "data.seq_len=64", "train.max_steps=20"]
    args += ["checkpoint.interval_steps=10", "train.eval_interval=10", "train.global_batch_size=40"]
    done = run_cli(args, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    saved = [e for e in ledger_events(run) if isinstance(e, CheckpointSaved)]
    assert [e.step for e in saved] == [10, 20]
    for e in saved:
        per = e.data_position["per_source"]
        consumed = e.data_position["consumed_samples"]
        assert sum(per.values()) == consumed == 40 * e.step
        assert abs(per[str(a)] - 0.7 * consumed) <= 1 and abs(per[str(b)] - 0.3 * consumed) <= 1
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "valid_loss" in r] == [10, 20]


def test_evaluation_does_not_change_training_so_it_is_not_in_the_fingerprint(workdir):
    base = ["train.max_steps=12", "train.log_interval=1", "checkpoint.interval_steps=0"]
    off = run_cli(base + ["train.eval_interval=0", "name=off"], cwd=workdir)
    on = run_cli(base + ["train.eval_interval=3", "name=on"], cwd=workdir)
    assert off.returncode == 0 and on.returncode == 0, off.stderr + on.stderr
    runs = {p.parent.name: p for p in run_dirs(workdir / "runs")}
    assert runs["off"].name == runs["on"].name  # same fingerprint
    rows = {k: read_jsonl(p / "metrics.jsonl") for k, p in runs.items()}
    assert [r["loss"] for r in rows["off"]] == [r["loss"] for r in rows["on"]]  # bitwise
    assert [r["step"] for r in rows["on"] if "valid_loss" in r] == [3, 6, 9, 12]
    assert not any("valid_loss" in r for r in rows["off"])
