"""The ledger: one writer per file, merged in time order, fate events fsynced, bad lines reported."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

from slurmtrain.common import events, jsonl, read_skips
from slurmtrain.common.rundir import RunDir, read_jsonl

WRITERS, ROWS = 6, 40


def _writer(path: str, n: int) -> None:
    run = RunDir(Path(path))
    for i in range(n):
        tag = {"writer": os.getpid(), "i": i}  # keys no class declares: kept in `extra`
        row = events.Straggler(extra=tag) if i % 2 else events.CheckpointSaved(extra=tag)
        run.record(row, job_id="1")


def test_concurrent_writers_never_share_a_file_and_nothing_is_lost(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), ROWS)) for _ in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    run = RunDir(tmp_path)
    assert not run.ledger.exists()  # nobody appends to one shared file any more
    files = run.ledger_files()
    assert len(files) == WRITERS
    for f in files:  # one writer per file: every row of a file comes from the pid in its name
        writers = {row["writer"] for row in read_jsonl(f)}
        assert writers == {int(f.name.split(".")[-3])}, (f.name, writers)
    rows = run.events()
    assert len(rows) == WRITERS * ROWS
    times = [e.time for e in rows]
    assert times == sorted(times)
    for pid in {e.extra["writer"] for e in rows}:  # each writer's own order is kept
        assert [e.extra["i"] for e in rows if e.extra["writer"] == pid] == list(range(ROWS))


def test_fate_events_are_fsynced_and_others_are_not(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    run = RunDir(tmp_path)
    run.record(events.Straggler(), job_id="1")  # creates ledger.d/ (its entry is synced once)
    synced.clear()
    run.record(events.Straggler(), job_id="1")  # not a fate event: no fsync
    assert synced == []
    crash = events.FailureClass.crash
    fate = (
        events.Started(),
        events.AttemptEnded(cls=crash),
        events.Stopped(cls=crash),
        events.Finished(),
        events.Submitted(),
        events.Requeued(),
    )
    for event in fate:
        synced.clear()
        run.record(event, job_id="1")
        assert synced, f"{event.event} was not fsynced"
    run2 = RunDir(tmp_path / "fresh")
    synced.clear()
    run2.record(events.Started(), job_id="2")  # new file and new directory: their entries too
    assert len(synced) >= 3


def test_a_corrupt_line_is_reported_once_with_file_and_line(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path)
    run.record(events.Started(), job_id="1", attempt=1)
    [own] = run.ledger_files()
    with open(own, "ab") as f:
        f.write(b'{"event": "fini\x00\xff garbage\n')
    run.record(events.Finished(step=9), job_id="1", attempt=1)
    assert [e.event for e in run.events()] == ["started", "finished"]
    read_skips.warn("slurmtrain")  # one line at the end of the command (#37 Build 5)
    err = capsys.readouterr().err
    assert f"{own}:2" in err and "warning" in err
    run.events()
    read_skips.warn("slurmtrain")
    assert capsys.readouterr().err == ""  # once per process, not at every read


def test_a_torn_last_line_is_skipped_quietly(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path)
    run.record(events.Started(), job_id="1", attempt=1)
    [own] = run.ledger_files()
    with open(own, "ab") as f:
        f.write(b'{"event": "checkpoint_sa')  # a writer mid-append
    assert [e.event for e in run.events()] == ["started"]
    assert capsys.readouterr().err == ""


def test_an_old_single_file_ledger_still_reads_and_merges_in_time_order(tmp_path: Path) -> None:
    rows = [{"event": "submitted", "time": 1.0, "job_id": "5"}, {"event": "started", "time": 3.0}]
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = RunDir(tmp_path)
    assert [e.event for e in run.events()] == ["submitted", "started"]
    jsonl.append_own(run.ledger_dir, {"event": "signal", "time": 2.0})
    assert [e.event for e in run.events()] == ["submitted", "signal", "started"]
    assert [e.time for e in run.events() if isinstance(e, events.Started)] == [3.0]
    # code still reading the old path gets the whole merged ledger, never half of it
    assert [e["event"] for e in read_jsonl(run.ledger)] == ["submitted", "signal", "started"]


def test_metrics_files_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_a_forked_child_writes_its_own_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.record(events.Started(), job_id="1")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        run.record(events.Failed(cls=events.FailureClass.crash), job_id="1")
        os._exit(0)
    os.waitpid(pid, 0)
    assert len(run.ledger_files()) == 2
    assert [e.event for e in run.events()] == ["started", "failed"]


def test_a_row_appended_after_a_dead_writers_torn_line_is_kept(tmp_path: Path, capsys) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # attempt 1 killed mid-line
    jsonl.append_jsonl(path, {"step": 2, "loss": 1.5})  # attempt 2 resumes
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    read_skips.warn("slurmtrain")  # one line at the end of the command (#37 Build 5)
    assert f"{path}:2" in capsys.readouterr().err  # the torn line, now inside: reported
