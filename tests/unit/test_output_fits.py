"""Output that fits (#36): a dry run prints the plan first, in <= 40 lines of <= 120 columns, and
writes the full config (and batch script) to files it names; a sweep dry run prints a line a point
and a summary, and exits 2 when a point would be refused; a local run whose stdout is a file prints
plain progress lines, and an attempt that loads a checkpoint says where it resumed from.

Before: the headline dry run printed 186 lines (263 with Slurm: the 150-line config before the plan,
then the batch script), its longest 336 columns; a 3-point sweep 735 lines; "nodes 64 x 8 tasks
(8 GPUs)"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmtrain.common.resumed import resumed_line
from slurmtrain.login import local_submit
from tests.conftest import run_cli

HEADLINE = ["model=opt13b", "nodes=64", "gpus_per_node=8", "dry_run=true", "cluster=local"]


def _fits(text: str, most: int) -> list[str]:
    lines = text.splitlines()
    assert len(lines) <= most, text
    assert max(len(line) for line in lines) <= 120, text
    return lines


def test_the_headline_dry_run_fits_and_names_the_full_config(workdir, tmp_path):
    done = run_cli(HEADLINE, cwd=workdir, env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr  # cluster=local, 64 nodes: refused after the plan
    out = _fits(done.stdout + done.stderr, 40)
    assert out[0].startswith("plan: opt13b"), out[:3]  # the plan first, not the config
    assert "64 nodes x 8 GPUs = 512 ranks" in out[0]
    [path] = re.findall(r"full config \(or --cfg job\):\s+(\S+)", done.stdout)
    config = Path(path).read_text()
    assert "num_layers: 40" in config and "gpus_per_node: 8" in config
    assert "plan: memory/GPU" in (Path(path).parent / "plan.txt").read_text()  # unwrapped
    assert "nodes=64: the local executor runs on this machine only" in done.stderr
    assert not (workdir / "runs").exists()  # the run directory stays unwritten


def test_a_sweep_dry_run_prints_a_line_a_point_and_exits_2_when_one_is_refused(workdir, tmp_path):
    args = ["-m", "optim.lr=1e-3,2e-3", "nodes=1,2", "dry_run=true", "cluster=local"]
    done = run_cli(args, cwd=workdir, env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 2, done.stdout + done.stderr
    out = _fits(done.stdout, 8)
    points = [line for line in out if line.startswith("point ")]
    assert len(points) == 4, out
    assert points[1].startswith("point 2/4 refused optim.lr=0.001 nodes=2: 2 nodes x 2 CPU ranks")
    assert points[0].startswith("point 1/4 ok")
    assert "4 sweep points, 2 ok, 2 refused" in done.stdout
    [error] = [line for line in done.stderr.splitlines() if "error:" in line]
    assert "2 of 4 sweep points would be refused (point 2 first)" in error and len(error) <= 120
    assert "nodes=2: the local executor runs on this m" in points[1]
    [folder] = re.findall(r" under\s+(\S+)", done.stdout)
    [written] = Path(folder).rglob("point-2/dry_run.txt")  # under the point's fingerprint
    why = written.read_text()
    assert "error: nodes=2: the local executor runs on this machine only; use nodes=1" in why


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_plain_progress_lines_come_at_least_every_interval(monkeypatch, capsys):
    clock = _Clock()
    monkeypatch.setattr(local_submit.time, "monotonic", clock)
    lines = local_submit._Lines(max_steps=200)
    lines.refresh(None)
    assert capsys.readouterr().out == ""  # nothing logged yet, not yet due
    row = {"step": 40, "loss": 4.12, "tokens_per_s": 21000.0, "eta_s": 8.2}
    lines.refresh(row)  # the first step: at once
    assert capsys.readouterr().out == "train: step 40/200, loss 4.1200, 21,000 tok/s, ETA 0:00:08\n"
    clock.now += local_submit.PLAIN_EVERY_S - 1
    lines.refresh({**row, "step": 41})
    assert capsys.readouterr().out == ""
    clock.now += 1  # due: the newest row, even with no new one since
    lines.refresh(None)
    assert capsys.readouterr().out.startswith("train: step 41/200")
    lines.refresh({**row, "step": 42}, final=True)  # the end: the last row
    assert capsys.readouterr().out.startswith("train: step 42/200")
    assert local_submit.PLAIN_EVERY_S <= 30


@pytest.mark.parametrize("universal", [False, True])
def test_the_resumed_line_says_step_path_and_age(universal):
    line = resumed_line(40, "/r/checkpoints/step_40", 1000.0, now=1200.0, universal=universal)
    assert line.startswith("slurmtrain: resumed from step_40 (/r/checkpoints/step_40, saved 3m20s")
    assert ("universal checkpoint" in line) == universal
    assert resumed_line(3, "/p", None) == "slurmtrain: resumed from step_3 (/p)"


def test_rank_0_prints_a_line_at_least_every_heartbeat_between_logged_steps(
    monkeypatch, capsys, tmp_path
):
    from slurmtrain.compute.observe import metrics

    clock = _Clock()
    monkeypatch.setattr(metrics.time, "monotonic", clock)
    writer = metrics.MetricsWriter(tmp_path / "m.jsonl", True, 1, None, print_lines=True)
    writer.heartbeat(10, 100, 4096, loss=3.0, lr=1e-3)  # the first step seen: the clock starts
    clock.now += metrics.HEARTBEAT_S - 1
    writer.heartbeat(11, 100, 4096, loss=3.0, lr=1e-3)
    assert capsys.readouterr().err == ""
    clock.now += 1  # 20 s over 10 steps: 2 s a step, 2,048 tok/s, 80 steps left
    writer.heartbeat(20, 100, 4096, loss=2.5, lr=1e-3)
    line = capsys.readouterr().err
    assert line.startswith("step 20/100 loss 2.5000 lr 1.00e-03 tok/s 2,048 step 2.000s"), line
    assert line.rstrip().endswith("ETA 0:02:40"), line
    assert not (tmp_path / "m.jsonl").exists()  # nothing written: a printed line only
    assert metrics.HEARTBEAT_S <= 30
