"""The ledger's two tiers (common/jsonl.py): rows any rank writes go to one file per node per
attempt key, written with whole-line O_APPEND writes; readers take one tier, or one attempt."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

from slurmtrain.common import events, jsonl, jsonl_lines, ledger, read_skips
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir, read_jsonl
from slurmtrain.compute.attempt import Attempt, _close_previous_attempt
from slurmtrain.compute.distributed import Placement

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
PEER = "RuntimeError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer"


def _attempt(run: RunDir, rank: int, node: str, job: str = "77", number: int = 3):
    where = Placement(rank, rank % 8, 16, "n1", 29500, job, node)
    return Attempt(run, where, ["n1", "n2"], number)


def _rank_fails(path: str, rank: int) -> None:
    _attempt(RunDir(Path(path)), rank, "n1").record_any(
        events.Failed(cls=FailureClass.crash, error=f"{PEER} (rank {rank})", step=5)
    )


def test_eight_ranks_of_a_node_share_one_file_and_every_row_parses(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_fails, args=(str(tmp_path), r)) for r in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    run = RunDir(tmp_path)
    [node_file] = run.rank_files("77")
    assert node_file == tmp_path / "ledger.d" / "ranks" / "77.0.0" / "n1.jsonl"
    rows = read_jsonl(node_file)
    assert sorted(r["rank"] for r in rows) == list(range(8))
    assert all(r["attempt"] == 3 and r["node"] == "n1" and r["restart"] == 0 for r in rows)
    assert run.ledger_files() == []  # no rank wrote a file of its own in the run tier


def test_a_failure_of_64_nodes_x_8_ranks_makes_64_files_and_o_nodes_fsyncs(
    tmp_path: Path, monkeypatch
) -> None:
    run = RunDir(tmp_path)
    run.record(events.Started(restart=0, relaunch=0), job_id="77", attempt=3)  # rank 0: run tier
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    for node in range(64):
        for local in range(8):
            _attempt(run, node * 8 + local, f"n{node}").record_any(
                events.Failed(cls=FailureClass.crash, error=PEER)
            )
    assert len(run.rank_files("77")) == 64
    assert len(run.ledger_files()) == 1  # + the run tier, not 512 files
    assert len(run.rank_rows("77")) == 512
    assert len(synced) <= 2 * 64 + 4, len(synced)  # the file and its entry, per node


def test_a_rank_killed_mid_write_never_swallows_another_ranks_row(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path)
    _rank_fails(str(tmp_path), 0)
    [path] = run.rank_files("77")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child: half a row, then dies as if SIGKILLed
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b'\n{"event": "failed", "rank": 1, "err')
        os._exit(9)
    os.waitpid(pid, 0)
    _rank_fails(str(tmp_path), 2)  # another rank of the node, after the torn line
    assert [r.rank for r in run.rank_rows("77")] == [0, 2]
    read_skips.warn("slurmtrain")  # one line at the end of the command (#37 Build 5)
    assert f"{path}:" in capsys.readouterr().err  # the torn line, now inside: reported


def test_readers_take_one_tier_or_one_attempt(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.record(events.Submitted(), job_id="77")
    run.record(events.Started(restart=0, relaunch=0), job_id="77", attempt=1)
    for relaunch in (0, 1):
        run.record_rank(
            events.Failed(cls=FailureClass.crash, rank=9, error=f"boom {relaunch}"),
            job_id="77",
            restart=0,
            relaunch=relaunch,
            on_node="n2",
        )
    run.record(events.AttemptEnded(cls=FailureClass.crash), job_id="77", attempt=1)
    assert [e.event for e in run.run_events()] == ["submitted", "started", "attempt_ended"]
    assert [e.error for e in run.rank_rows("77", 0, 1) if isinstance(e, events.Failed)] == [
        "boom 1"
    ]
    view = run.attempt_events("77", 0, 0)
    assert [e.event for e in view] == ["submitted", "started", "failed", "attempt_ended"]
    assert (
        len(run.events()) == 5
        and len([e for e in run.events() if isinstance(e, events.Failed)]) == 2
    )
    times = [e.time for e in run.events()]
    assert times == sorted(times)
    assert ledger.newest_key(run.run_events()) == ("77", 0, 0)
    # the old path still returns the whole ledger, both tiers
    assert len(read_jsonl(run.ledger)) == 5


def test_rank_zero_closes_a_vanished_attempt_from_its_rank_rows(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    started = events.Started(restart=0, relaunch=0)
    run.record(started, job_id="77", attempt=3, nodes=["n1", "n2"])
    _attempt(run, 5, "n1").record_any(events.Failed(cls=FailureClass.crash, error=OOM))
    nxt = _attempt(run, 0, "n1", job="78", number=4)
    nxt.rows = run.run_events()
    assert not any(isinstance(e, events.Failed) for e in nxt.rows)  # the OOM: in the rank tier
    _close_previous_attempt(run, nxt)
    [ended] = [e for e in run.run_events() if isinstance(e, events.AttemptEnded)]
    assert ended.cls == FailureClass.oom and ended.attempt == 3 and ended.closed_by == 4
    assert ended.job_id == "77" and ended.nodes == ("n1", "n2")
    assert nxt.rows[-1] == ended  # rank 0's list is kept up to date, not re-read


def test_an_old_runs_per_process_failure_rows_still_count(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.record(events.Started(restart=0, relaunch=0), job_id="77", attempt=3)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child: a rank writing as before the rank tier
        run.record(events.Failed(cls=FailureClass.crash, error=OOM, rank=4), job_id="77", attempt=3)
        os._exit(0)
    os.waitpid(pid, 0)
    assert len(run.ledger_files()) == 2
    assert ledger.vanished_class(run.run_events(), 3) == "oom"
    assert ledger.vanished_class(run.attempt_events("77"), 3) == "oom"


def test_the_tail_reader_returns_the_newest_rows_first_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "pad": "x" * (i % 37)} for i in range(500)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 500, "lo')
    for block in (7, 64, 1 << 16):
        assert [r["step"] for r in jsonl.tail_jsonl(path, block)] == list(range(499, -1, -1))
    path.write_text('{"step": 1}')  # no newline at all: a whole row is kept
    assert [r["step"] for r in jsonl.tail_jsonl(path, 4)] == [1]
    assert list(jsonl.tail_jsonl(tmp_path / "missing.jsonl")) == []


def test_merging_many_files_holds_one_open(tmp_path: Path, monkeypatch) -> None:
    opened, most = [0], [0]
    real_open = open

    class Counting:
        def __init__(self, *a, **k):
            self.f = real_open(*a, **k)
            opened[0] += 1
            most[0] = max(most[0], opened[0])

        def __enter__(self):
            return self.f

        def __exit__(self, *exc):
            opened[0] -= 1
            self.f.close()

    paths = []
    for i in range(50):
        paths.append(tmp_path / f"{i}.jsonl")
        paths[-1].write_text(json.dumps({"time": 100 - i, "i": i}) + "\n")
    monkeypatch.setattr(jsonl_lines, "open", Counting, raising=False)  # where files are read
    merged = jsonl.merge_jsonl(paths)
    assert [r["i"] for r in merged] == list(range(49, -1, -1)) and most[0] == 1


def test_rows_of_a_shared_node_file_come_back_in_time_order(tmp_path: Path) -> None:
    """Ranks of a node append in arrival order, not clock order: readers sort each node file."""
    run = RunDir(tmp_path)
    node_file = tmp_path / "ledger.d" / "ranks" / "77.0.0" / "n1.jsonl"
    node_file.parent.mkdir(parents=True)
    node_file.write_text(
        "".join(
            json.dumps({"event": "failed", "time": t, "rank": r}) + "\n"
            for r, t in ((1, 5.0), (0, 4.0), (2, 6.0))
        )
    )
    run.record_rank(
        events.Failed(cls=FailureClass.crash, rank=8),
        job_id="77",
        restart=0,
        relaunch=0,
        on_node="n2",
    )
    assert [e.rank for e in run.rank_rows("77")] == [0, 1, 2, 8]
    assert [e.rank for e in run.events() if isinstance(e, events.Failed)] == [0, 1, 2, 8]
