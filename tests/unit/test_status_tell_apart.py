"""#36 Build 3, runs you can tell apart: the default name is the model, and `status` shows each
run's model, the values that tell a sweep's points apart, step/max, the state with its cause (a
Ctrl-C is `stopped: by you (Ctrl-C)`) and its age. Run directories written by hand, as a local
run writes them; no Slurm."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.cli import status, status_select, status_table
from slurmtrain.common import events, schema
from slurmtrain.common.events import FailureClass
from slurmtrain.common.liveness import pid_start

ME = dict(pid=os.getpid(), host=socket.gethostname(), pid_start=pid_start(os.getpid()))
CONFIG = "model:\n  name: {model}\n  num_layers: 2\ntrain:\n  lr_x: 1\n  max_steps: 200\nfaults:\n"
CONFIG += "  spare_nodes: 0\nname: {name}\n"


def make_run(root: Path, fp: str, lr: str, end: str, t: float, model: str = "opt125m") -> Path:
    run = root / model / fp
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(CONFIG.format(model=model, name=model))
    given = [f"model={model}", "cluster=local", f"optim.lr={lr}", f"runs_root={root}"]
    (run / "overrides.yaml").write_text("".join(f"- {g}\n" for g in given))
    job = f"{fp}-job"
    sub = dataclasses.replace(events.Submitted(time=t, job_id=job, executor="local", **ME), pid=1)
    rows: list[events.Row] = [sub, events.Started(time=t + 1, job_id=job, attempt=1)]
    if end == "ctrl-c":
        cancelled = FailureClass.cancelled
        rows.append(events.AttemptEnded(time=t + 2, job_id=job, cls=cancelled, closed_by="ctrl-c"))
    elif end == "finished":
        rows.append(events.Finished(time=t + 2, job_id=job, step=200))
    ledger = run / "ledger.d" / "host.1.abc.jsonl"
    ledger.parent.mkdir()
    ledger.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    step = 200 if end == "finished" else 40
    (run / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 3.0}) + "\n")
    return run


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "runs"
    now = time.time()
    make_run(root, "aaa", "0.0001", "finished", now - 7200)
    make_run(root, "bbb", "0.0003", "ctrl-c", now - 600)
    make_run(root, "ccc", "0.001", "finished", now - 3 * 86400 - 10)
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(root))
    monkeypatch.setenv("SLURMTRAIN_STATUS_CACHE", "off")
    return root


def test_status_over_a_three_point_sweep_shows_the_swept_values(sweep, capsys):
    assert status.main(["--json"]) == 0
    rows = {Path(r["run"]).name: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["aaa"]["swept"] == ["optim.lr=0.0001"] and rows["bbb"]["swept"] == [
        "optim.lr=0.0003"
    ]
    assert rows["ccc"]["model"] == "opt125m" and rows["ccc"]["max_steps"] == 200
    assert status.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:8] == [
        "name",
        "run",
        "model",
        "swept",
        "state",
        "step",
        "age",
        "attempt",
    ]
    [bbb] = [ln for ln in out if " bbb " in ln]
    assert "opt125m" in bbb and "lr=0.0003" in bbb and "40/200" in bbb and " 9m " in bbb
    assert "stopped: by you (Ctrl-C)" in bbb  # it said `stopped` with no cause
    [ccc] = [ln for ln in out if " ccc " in ln]
    assert "lr=0.001 " in ccc and "200/200" in ccc and " 3d " in ccc
    assert all(len(ln) <= 120 for ln in out), out


def test_a_lone_run_shows_no_swept_values_and_its_cause_stays_its_class(tmp_path):
    run = make_run(tmp_path, "ddd", "0.001", "ctrl-c", 1000.0, model="opt13b")
    [row] = [status.summarize(status.RunDir(run))]
    status_select.add_swept([row])  # type: ignore[list-item]
    assert row["swept"] == [] and row["model"] == "opt13b"
    assert row["state"] == "stopped: by you (Ctrl-C)" and row["class"] is None


def test_varied_keeps_what_differs_and_the_table_shortens_its_keys():
    points = [
        ["cluster=local", "optim.lr=1e-3", "+data.seed=1"],
        ["cluster=local", "optim.lr=3e-3"],
    ]
    assert status_select.varied(points) == [["optim.lr=1e-3", "+data.seed=1"], ["optim.lr=3e-3"]]
    assert status_table.swept_text(["optim.lr=1e-3", "+data.seed=1"]) == "lr=1e-3 seed=1"
    assert status_table.swept_text(["optim.lr=1", "model.lr=2"]) == "optim.lr=1 model.lr=2"
    assert status_table.age(0.0, now=59.0) == "59s" and status_table.age(0.0, now=7300) == "2h"


def _cfg(*overrides: str):
    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_two_models_get_different_default_names():
    """It was `demo` for every model (the opt13b job was `st-demo`); `name=` still wins."""
    from slurmtrain.login.slurm_submit import job_name

    small, big = _cfg("model=opt125m"), _cfg("model=opt13b")
    assert (small.name, big.name) == ("opt125m", "opt13b")
    assert job_name(big) == "st-opt13b"  # type: ignore[arg-type]
    assert _cfg("model=opt13b", "name=lr_sweep").name == "lr_sweep"


def test_a_local_sweep_heads_each_point_with_its_values():
    """A local sweep printed its points' output with no line saying which point it was."""
    from slurmtrain.login.launch import point_headers

    given = [["cluster=local", f"optim.lr={lr}", "name=lr", "runs_root=/r"] for lr in (1, 3, 9)]
    runs = [Path(f"/r/lr/{fp}") for fp in ("aaa", "bbb", "ccc")]
    headers = point_headers(given, runs)
    assert headers[1] == "slurmtrain: sweep point 2/3: optim.lr=3 (/r/lr/bbb)"
    assert len(headers) == 3 and headers[2].startswith("slurmtrain: sweep point 3/3: optim.lr=9")
