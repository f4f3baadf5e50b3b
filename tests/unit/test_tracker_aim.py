"""Aim, the tracker added in one module (common/tracker_aim.py): its offline run across a requeue
is ONE Aim run in RUN_DIR/aim with steps 1..N once each, and its missing package is one line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("aim")  # the `aim` extra (in `test`)

from slurmtrain.common import events  # noqa: E402
from slurmtrain.common.events import FailureClass  # noqa: E402
from slurmtrain.common.tracker_aim import AimBackend, AimLogger  # noqa: E402
from slurmtrain.compute.observe import trackers  # noqa: E402


@dataclass
class Ctx:  # common/tracker_registry.Context, without a composed config
    path: Path
    attempt: int
    rows: list = field(default_factory=list)
    run_id: str = "demo-34307bf8b1dd"
    fingerprint: str = "34307bf8b1dd"

    def config(self):
        return {"train": {"max_steps": 7}}

    def plan(self):
        return {"params": 1234}

    def provenance(self):
        return {"git": "abc"}

    def started(self):
        return events.Started(attempt=self.attempt, job_id=f"{100 + self.attempt}", world_size=1)


def _attempt(run: Path, n: int, trained: list[int], rows: list) -> None:
    """One attempt on rank 0: open (resume), log the steps trained, close."""
    ctx = Ctx(run, n, rows)
    axis = trackers.StepAxis(trackers.last_logged_step(run / "metrics.jsonl"))
    t = trackers.Trackers([AimBackend(ctx, AimLogger())], axis, rows, attempt=n)
    with open(run / "metrics.jsonl", "a") as f:
        for step in trained:
            f.write(f'{{"step": {step}, "loss": {1.0 / step}}}\n')
            t.log(step, {"loss": 1.0 / step})
    t.close()


def _read_back(repo: Path) -> dict[str, dict]:
    """{run hash: {"attrs": ..., "steps": {metric: steps}}} from the Aim repository."""
    from aim import Repo, Run
    from aim.sdk.index_manager import RepoIndexManager

    store = Repo(str(repo))
    index = RepoIndexManager.get_index_manager(store)
    out = {}
    for run_hash in store.list_all_runs():
        index.index(run_hash)  # what `aim up` does in the background
        run = Run(run_hash=run_hash, repo=str(repo), read_only=True)
        steps = {m.name: m.data.indices_list() for m in run.metrics()}
        out[run_hash] = {"run": run, "steps": steps}
    return out


def test_an_aim_run_continues_across_a_requeue_with_a_monotonic_step_axis(tmp_path):
    run = tmp_path / "runs" / "demo" / "34307bf8b1dd"
    run.mkdir(parents=True)
    rows = [events.Started(attempt=1)]
    _attempt(run, 1, [1, 2, 3, 4], rows)  # then the time limit: requeued
    rows += [
        events.AttemptEnded(attempt=1, cls=FailureClass.timed_out),
        events.Requeued(attempt=1),
        events.Started(attempt=2),
    ]
    _attempt(run, 2, [3, 4, 5, 6, 7], rows)  # resumed from step 2's checkpoint
    [(run_hash, found)] = _read_back(run / "aim").items()  # ONE Aim run
    assert (run / "aim" / "slurmtrain_run_hash-demo-34307bf8b1dd").read_text().strip() == run_hash
    assert found["steps"]["loss"] == [1, 2, 3, 4, 5, 6, 7]
    assert found["steps"]["failure_class/timed_out"] == [5]  # the requeue, on the axis
    aim_run = found["run"]
    assert aim_run["slurmtrain_run_id"] == "demo-34307bf8b1dd" and aim_run["attempt"] == 2
    assert aim_run["attempt_2"]["job_id"] == "102" and aim_run["attempt_1_outcome"] == "paused"


def test_a_missing_aim_is_refused_at_login_in_one_line(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema, validation_login
    from slurmtrain.common.errors import ConfigError

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=[f"runs_root={tmp_path}", "logger=[tensorboard,aim]"])
    assert cfg.logger.aim.experiment == "slurmtrain"
    monkeypatch.setattr(validation_login, "_installed", lambda package: package != "aim")
    with pytest.raises(ConfigError) as err:
        validation_login.check_trackers(cfg)
    assert str(err.value) == (
        "logger=aim: the aim package is not installed; pip install 'slurmtrain[aim]' "
        "(or leave aim out of logger=)"
    )


KILLED = """
import os, sys
from pathlib import Path
from tests.unit.test_tracker_aim import AimBackend, AimLogger, Ctx
backend = AimBackend(Ctx(Path(sys.argv[1]), 1), AimLogger())
for step in (1, 2, 3):
    backend.log(step, {"loss": 1.0 / step}, [])
os._exit(137)  # SIGKILL after the grace time: no close, the run's lock left behind
"""


def test_an_aim_run_survives_a_killed_attempt(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    run = tmp_path / "run"
    run.mkdir()
    done = subprocess.run([sys.executable, "-c", KILLED, str(run)], cwd=ROOT, capture_output=True)
    assert done.returncode == 137, done.stderr.decode()[-2000:]
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (1, 2, 3)))
    _attempt(run, 2, [3, 4, 5], [events.Started(attempt=2)])  # resumes, past the lock
    [found] = _read_back(run / "aim").values()
    assert found["steps"]["loss"] == [1, 2, 3, 4, 5]
