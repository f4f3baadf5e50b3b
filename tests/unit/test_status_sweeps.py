"""`cli status` made for sweeps: a name directory, a bare name, a glob, `--state`, newest first,
and one summary line per sweep (points by state, best valid_loss and its overrides). Run
directories are written by hand (the layout real runs write); local runs, so no Slurm."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Sequence

import pytest

from slurmtrain.cli import status
from slurmtrain.common import events
from slurmtrain.common.events import FailureClass
from slurmtrain.common.liveness import pid_start

ME = dict(pid=os.getpid(), host=socket.gethostname(), pid_start=pid_start(os.getpid()))


def _rows(path: Path, rows: Sequence[events.Row | dict[str, object]]) -> None:
    """Ledger rows (objects) or metrics rows (dicts) as the file holds them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (r.to_json() if isinstance(r, events.Row) else r for r in rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def make_run(
    root: Path, name: str, fp: str, kind: str, t: float, lr: float = 1e-3, valid: float = 3.0
) -> Path:
    """One run directory: config, overrides, ledger and metrics as a local run writes them."""
    run = root / name / fp
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"optim:\n  lr: {lr}\nfaults:\n  spare_nodes: 0\nname: {name}\n"
    )
    (run / "overrides.yaml").write_text(f"- name={name}\n- optim.lr={lr}\n- runs_root={root}\n")
    if kind == "new":
        os.utime(run, (t, t))
        return run
    job = f"{fp}-job"
    sub = events.Submitted(time=t, job_id=job, executor="local", **ME)
    if kind != "running":
        sub = dataclasses.replace(sub, pid=1)  # not ours: the owner is gone
    rows: events.Rows = [sub, events.Started(time=t + 1, job_id=job, attempt=1)]
    if kind == "finished":
        rows.append(events.Finished(time=t + 3, job_id=job, step=20))
    if kind == "diverged":
        diverged = FailureClass.diverged
        rows.append(events.Stopped(time=t + 3, job_id=job, cls=diverged, error="nan"))
    _rows(run / "ledger.d" / "host.1.abc.jsonl", rows)
    metrics: list[dict[str, object]] = [{"step": 10, "time": t + 2, "loss": valid + 1}]
    metrics.append({"step": 20, "time": t + 2.5, "loss": valid, "valid_loss": valid})
    _rows(run / "metrics.jsonl", metrics)
    return run


@pytest.fixture
def sweep_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "runs"
    make_run(root, "lr_sweep", "aaa", "finished", 1000.0, lr=1e-3, valid=2.5)
    make_run(root, "lr_sweep", "bbb", "finished", 3000.0, lr=3e-3, valid=2.1)
    make_run(root, "lr_sweep", "ccc", "diverged", 2000.0, lr=1e-2, valid=9.0)
    make_run(root, "lr_sweep", "ddd", "running", 4000.0, lr=1e-4, valid=3.3)
    make_run(root, "lr_warmup", "eee", "finished", 500.0, lr=1e-3, valid=2.9)
    make_run(root, "baseline", "fff", "new", 5000.0)
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(root))
    monkeypatch.setenv("SLURMTRAIN_STATUS_CACHE", str(tmp_path / "cache" / "status.json"))
    monkeypatch.chdir(tmp_path)
    return root


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert status.main(["--json", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _fps(rows: list[dict[str, object]]) -> list[str]:
    return [Path(str(r["run"])).name for r in rows]


def test_a_name_directory_lists_its_runs(
    sweep_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: "status: no runs under runs/lr_sweep" (only a root or a run directory was read)
    assert sorted(_fps(_json(capsys, "runs/lr_sweep"))) == ["aaa", "bbb", "ccc", "ddd"]
    assert sorted(_fps(_json(capsys, str(sweep_root / "lr_sweep")))) == ["aaa", "bbb", "ccc", "ddd"]


def test_a_bare_name_is_found_under_the_runs_root(
    sweep_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chdir(sweep_root.parent.parent)  # the name is not a path from here
    assert _fps(_json(capsys, "lr_warmup")) == ["eee"]
    (sweep_root.parent.parent / "lr_warmup").mkdir()  # a folder of that name, with no runs
    assert _fps(_json(capsys, "lr_warmup")) == ["eee"]


def test_globs_select_names(sweep_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sorted(_fps(_json(capsys, "runs/lr_*"))) == ["aaa", "bbb", "ccc", "ddd", "eee"]
    assert sorted(_fps(_json(capsys, "lr_w*"))) == ["eee"]  # a bare glob: under the runs root
    assert sorted(_fps(_json(capsys, "runs/*/fff"))) == ["fff"]  # run directories match too


def test_whole_root_newest_first(sweep_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # newest ledger row first; a run with no ledger by its directory's mtime
    assert _fps(_json(capsys)) == ["fff", "ddd", "bbb", "ccc", "aaa", "eee"]


def test_state_filter_matches_the_state_word(
    sweep_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _json(capsys, "--state", "stopped")
    assert [(Path(str(r["run"])).name, r["state"]) for r in rows] == [("ccc", "stopped: diverged")]
    assert _fps(_json(capsys, "--state", "finished", "runs/lr_sweep")) == ["bbb", "aaa"]
    assert _fps(_json(capsys, "--state", "running,new")) == ["fff", "ddd"]
    assert _fps(_json(capsys, "--state", "failed")) == ["ccc"]
    assert status.main(["--state", "finished", "runs/baseline"]) == 0
    assert "no runs in state finished" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a typo is refused, not an empty answer
        status.main(["--state", "runing"])
    assert "--state runing: not a state" in capsys.readouterr().err


def test_one_summary_line_per_sweep(sweep_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert status.main([]) == 0
    out = capsys.readouterr().out
    [line] = [ln for ln in out.splitlines() if ln.startswith("sweep lr_sweep")]
    assert "4 points" in line and "2 finished" in line and "1 running" in line
    assert "1 stopped (diverged 1)" in line
    assert "best valid_loss 2.1000" in line and "optim.lr=0.003" in line
    assert "bbb" in line and "runs_root=" not in line and "name=" not in line
    assert not [ln for ln in out.splitlines() if ln.startswith("sweep lr_warmup")]  # one run


def test_figures_of_runs_that_do_not_run_are_remembered_until_a_file_grows(
    sweep_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def ended() -> list[dict[str, object]]:  # a running run's goodput grows with the clock
        return [r for r in _json(capsys) if r["state"] != "running"]

    first = ended()
    cache = json.loads((sweep_root.parent / "cache" / "status.json").read_text())["runs"]
    assert sorted(Path(p).name for p in cache) == ["aaa", "bbb", "ccc", "eee"]  # not ddd, fff
    assert ended() == first  # read back: the same rows
    with open(sweep_root / "lr_sweep" / "bbb" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 30, "time": 3002.7, "valid_loss": 1.5}) + "\n")
    [bbb] = [r for r in _json(capsys) if str(r["run"]).endswith("bbb")]
    assert (bbb["step"], bbb["valid_loss"]) == (30, 1.5)


def test_slurm_is_asked_once_for_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmtrain.common import slurm_cmd
    from slurmtrain.common.slurm_text import SlurmError

    root = tmp_path / "runs"
    for i, fp in enumerate(["r1", "r2", "r3", "r4"]):
        run = make_run(root, "sw", fp, "running", 100.0 + i)
        sub = events.Submitted(time=100.0 + i, job_id=f"9_{i}", executor="slurm")
        _rows(run / "ledger.d" / "host.1.abc.jsonl", [sub])
    calls: list[list[str]] = []

    def squeue(args: list[str], **_: object) -> str:
        calls.append(list(args))
        return "9_0|RUNNING|None\n9_1|PENDING|JobHeldUser\n9_2|COMPLETED|None\n"

    monkeypatch.setattr(slurm_cmd, "run", squeue)
    monkeypatch.setenv("SLURMTRAIN_STATUS_CACHE", "off")
    states = {Path(str(r["run"])).name: r["state"] for r in _json(capsys, str(root))}
    assert states == {"r1": "running", "r2": "running", "r3": "stopped", "r4": "stopped"}
    assert len(calls) == 1 and calls[0][:3] == ["squeue", "-h", "-r"]
    assert calls[0][calls[0].index("-j") + 1] == "9_0,9_1,9_2,9_3"
    calls.clear()

    def down(args: list[str], **_: object) -> str:
        calls.append(list(args))
        raise SlurmError("squeue: Unable to contact slurm controller")

    monkeypatch.setattr(slurm_cmd, "run", down)  # fail closed: unknown, and still one try each
    rows = _json(capsys, str(root))
    assert {str(r["state"]).split(":")[0] for r in rows} == {"unknown"}
    assert [c[0] for c in calls] == ["squeue", "sacct"]
