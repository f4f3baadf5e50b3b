"""Trackers (logger=): one tracker run per slurmtrain run, a step axis that only grows, events
that follow the metrics, bad input refused on the login node, the default's fingerprint kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import events, schema, validation_login
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import fingerprint
from slurmtrain.compute.observe import tracker_backends, trackers
from slurmtrain.login.prepare import resolve
from tests.conftest import read_jsonl

schema.register()


def _cfg(tmp_path, *overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"runs_root={tmp_path}", "cluster=local", "gpus_per_node=0", *overrides],
        )
    return resolve(cfg)


def test_run_id_is_the_fingerprint_and_fits_wandb():
    assert trackers.tracker_run_id("demo", "34307bf8b1dd") == "demo-34307bf8b1dd"
    long = trackers.tracker_run_id("x" * 100, "34307bf8b1dd")
    assert len(long) <= 64 and long.endswith("-34307bf8b1dd")
    assert not re.search(r"[/\\#?%:]", trackers.tracker_run_id("a:b/c", "f"))


def test_step_axis_passes_each_step_once_in_order():
    axis = trackers.StepAxis(last=3)  # steps 1-3 logged by an earlier attempt
    trained = [2, 3, 4, 5, 6, 4, 5, 6, 7, 8]  # resume from step 1, a rollback from 6 to 3
    assert [s for s in trained if axis.accept(s)] == [4, 5, 6, 7, 8]


def test_last_logged_step_reads_only_the_tail(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    assert trackers.last_logged_step(path) == 0
    rows = [{"step": s, "loss": 1.0} for s in (1, 2, 3, 7, 8, 5, 6)]  # rolled back from 8
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "lo')  # torn
    assert trackers.last_logged_step(path) == 8
    monkeypatch.setattr(trackers, "TAIL_BYTES", 100)  # rows 8, 5, 6 and a cut row 7
    assert trackers.last_logged_step(path) == 8


class Recorder:
    kind = "fake"

    def __init__(self):
        self.logged, self.closed = [], None

    def log(self, step, row, events):
        self.logged.append((step, row, [e.event for e in events]))

    def close(self, step, kept, events):
        self.closed = (step, [e.event for e in kept])


def test_events_ride_on_the_next_new_step_and_close_keeps_the_attempts_rows():
    rows = [
        events.Started(attempt=1),
        events.AttemptEnded(attempt=1, cls=FailureClass.timed_out),
        events.Requeued(attempt=1),
        events.Started(attempt=2, extra={"error": "token hf_abcdefghijklmnopqrstuvwxyz"}),
    ]
    fake = Recorder()
    t = trackers.Trackers([fake], trackers.StepAxis(10), rows, attempt=2)
    t.log(10, {"loss": 1.0})  # seen before: nothing sent, the events wait
    assert fake.logged == []
    t.log(11, {"loss": 0.9})
    step, row, names = fake.logged[0]
    assert step == 11 and names == ["attempt_ended", "requeued", "started"]
    assert row["failure_class/timed_out"] == 1.0 and row["loss"] == 0.9
    rows.append(events.Rollback(attempt=2, step=9))
    t.log(9, {"loss": 2.0})  # after the rollback: an old step, not sent
    t.log(12, {"loss": 0.8})
    assert [s for s, _, _ in fake.logged] == [11, 12] and fake.logged[1][2] == ["rollback"]
    rows.append(events.Finished(attempt=2, step=12))
    t.close()
    assert fake.closed == (12, ["attempt_ended", "requeued", "started", "rollback", "finished"])


def test_an_event_row_never_carries_a_secret():
    failed = events.Failed(cls=FailureClass.crash, error="401 for key hf_" + "a" * 30)
    row = tracker_backends.event_row(failed)
    assert "hf_" not in json.dumps(row) and row["event"] == events.Failed.kind


def test_a_failing_tracker_is_dropped_and_recorded_not_raised():
    class Broken(Recorder):
        kind = "broken"

        def log(self, step, row, events):
            raise RuntimeError("disk full")

    recorded, good = [], Recorder()
    t = trackers.Trackers([Broken(), good], trackers.StepAxis(), [], 1, record=recorded.append)
    t.log(1, {"loss": 1.0})
    t.log(2, {"loss": 1.0})
    assert [s for s, _, _ in good.logged] == [1, 2]
    assert recorded == [
        events.TrackerFailed(tracker="broken", phase="write", error="RuntimeError: disk full")
    ]


def test_logger_choices_compose_and_keep_the_default_fingerprint(tmp_path):
    default = _cfg(tmp_path)
    assert trackers.tensorboard_on(default) and trackers.wanted(default) == []
    both = _cfg(tmp_path, "logger=[wandb,mlflow,aim]")  # the registry's order: by name
    assert not trackers.tensorboard_on(both) and trackers.wanted(both) == ["aim", "mlflow", "wandb"]
    assert both.logger.wandb.mode == "offline"
    three = _cfg(tmp_path, "logger=[tensorboard,wandb,mlflow]", "logger.wandb.project=p")
    assert trackers.tensorboard_on(three) and three.logger.wandb.project == "p"
    # trackers do not change the weights: the same run (and the same W&B/MLflow run)
    assert fingerprint(default) == fingerprint(both) == fingerprint(three) == "34307bf8b1dd"


def test_a_config_from_before_logger_keeps_tensorboard(tmp_path):
    path = tmp_path / "config.yaml"
    cfg = _cfg(tmp_path)
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("logger")
    path.write_text(OmegaConf.to_yaml(data))
    old = schema.load_run_config(str(path))
    assert trackers.tensorboard_on(old) and trackers.wanted(old) == []


def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "logger=[tensorboard,mlflow]")
    monkeypatch.setattr(validation_login, "_installed", lambda package: package != "mlflow")
    with pytest.raises(ConfigError) as err:
        validation_login.check_trackers(cfg)
    assert "pip install 'slurmtrain[mlflow]'" in str(err.value) and "\n" not in str(err.value)


def test_a_bad_wandb_mode_is_refused(tmp_path):
    from slurmtrain.common.hydra_errors import one_line

    with pytest.raises(Exception) as err:  # at compose: logger.wandb.mode is a WandbMode
        _cfg(tmp_path, "logger=wandb", "logger.wandb.mode=sometimes")
    line = one_line(err.value) or ""
    assert line.startswith("logger.wandb.mode='sometimes': unknown; choose one of offline, online")


def test_no_counter_key_lies_below_another():
    # MLflow's file store makes each metric key a file: `event/failed` beside
    # `event/failed/crash` failed with "Not a directory" (seen on the cluster test's 2nd attempt)
    rows = [
        events.Failed(cls=FailureClass.crash),
        events.AttemptEnded(cls=FailureClass.timed_out),
        events.Rollback(),
    ]
    keys = set(trackers.event_counts(rows))
    assert f"event/{events.Failed.kind}" in keys and "failure_class/crash" in keys
    assert not [a for a in keys for b in keys if b.startswith(a + "/")], keys


def test_a_tensorboard_that_cannot_open_or_write_is_dropped_and_recorded_not_raised(
    tmp_path, capsys
):
    from slurmtrain.compute.observe.metrics import MetricsWriter

    (tmp_path / "file").write_text("")  # a file where its folder goes: root cannot create it
    recorded: list[events.Row] = []

    def writer(tensorboard: Path) -> MetricsWriter:
        return MetricsWriter(
            tmp_path / "metrics.jsonl", True, 1, tensorboard, False, record=recorded.append
        )

    blocked = writer(tmp_path / "file" / "attempt_1")
    blocked.log(1, 3, loss=1.0)
    blocked.finish()
    [opened] = recorded
    assert (opened.tracker, opened.phase) == ("tensorboard", "open")

    class Full:
        def add_summary(self, *_: object) -> None:
            raise OSError("No space left on device")

        def close(self) -> None:
            raise AssertionError("a dropped writer is not closed")

    failing = writer(tmp_path / "tb")
    assert failing.tb is not None
    failing.tb.close()
    failing.tb = Full()  # type: ignore[assignment]
    failing.log(2, 3, loss=1.0)
    failing.log(3, 3, loss=1.0)
    failing.finish()
    assert recorded[1:] == [
        events.TrackerFailed(
            tracker="tensorboard", phase="write", error="OSError: No space left on device"
        )
    ]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert capsys.readouterr().err.count("warning: tracker tensorboard failed") == 2
