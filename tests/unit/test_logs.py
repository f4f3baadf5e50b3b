"""Merged logs: order by attempt then timestamp, rank tags, and a first error that skips NCCL echoes."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from slurmtrain.cli import logs
from slurmtrain.cli.logs import LogMerger, describe, parse_timestamp
from slurmtrain.common import events

VALUE_ERROR_TB = """Traceback (most recent call last):
  File "/app/slurmtrain/train/data.py", line 40, in load_tokens
    raise ValueError("data.path=/x: no such file")
ValueError: data.path=/x: no such file"""

NCCL_TB = """Traceback (most recent call last):
  File "/venv/torch/distributed/distributed_c10d.py", line 2050, in all_reduce
    work = group.allreduce([tensor], opts)
torch.distributed.DistBackendError: [Rank 1] ProcessGroupNCCL watchdog timeout after 600000 ms"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.strip("\n") + "\n")


def make_logs(run: Path) -> Path:
    """Rank 1 logs an NCCL watchdog traceback at 10:00:03, before rank 0's real error (10:00:05; the
    traceback itself is untimed and inherits the time of the line above it)."""
    logs_dir = run / "logs"
    write(
        logs_dir / "attempt1.rank0.log",
        f"""
2024-05-01 10:00:00,100 INFO rank0 start
2024-05-01 10:00:02,000 INFO rank0 step 1
2024-05-01 10:00:05,000 ERROR rank0 loading data
{VALUE_ERROR_TB}
""",
    )
    write(
        logs_dir / "attempt1.rank1.log",
        f"""
2024-05-01 10:00:01,000 INFO rank1 start
2024-05-01 10:00:03,000 ERROR rank1 collective failed
{NCCL_TB}
""",
    )
    write(
        logs_dir / "attempt2.rank0.log",
        "2024-05-01 09:00:00,000 INFO rank0 attempt two (clock skew)\n",
    )
    write(
        logs_dir / "sub" / "attempt2.rank1.log",
        "no timestamp here\n2024-05-01 11:00:00 INFO rank1 a2\n",
    )
    return run


def test_timestamp_formats() -> None:
    assert (
        parse_timestamp("2024-05-01 10:00:00,250 INFO x")
        == datetime(2024, 5, 1, 10, 0, 0, 250000).timestamp()
    )
    assert parse_timestamp("2024-05-01T10:00:00Z x") == 1714557600.0
    assert parse_timestamp("2024-05-01T12:00:00+0200 x") == 1714557600.0
    assert parse_timestamp("submitit INFO (2024-05-01 10:00:00,000) - Starting") is not None
    assert parse_timestamp("step 10 loss 2.0") is None


def test_file_names_give_attempt_rank_and_job() -> None:
    for name, expected in [
        ("attempt3.rank12.log", (3, 12, None)),
        ("4242_7_log.err", (None, 7, "4242")),
        ("4242_3_7_log.out", (None, 7, "4242_3")),
        ("slurm-99.out", (None, None, "99")),
    ]:
        d = describe(Path(name))
        assert (d.attempt, d.rank, d.job_id) == expected


def test_merged_order_and_tags(tmp_path: Path) -> None:
    lines = [f"{ln.tag} {ln.text}" for ln in LogMerger(make_logs(tmp_path / "run"))]
    assert lines[:5] == [
        "[a1 r0] 2024-05-01 10:00:00,100 INFO rank0 start",
        "[a1 r1] 2024-05-01 10:00:01,000 INFO rank1 start",
        "[a1 r0] 2024-05-01 10:00:02,000 INFO rank0 step 1",
        "[a1 r1] 2024-05-01 10:00:03,000 ERROR rank1 collective failed",
        "[a1 r1] Traceback (most recent call last):",
    ]
    # Attempt 2 comes after all of attempt 1 even though its clock reads earlier; an untimed
    # first line keeps its place at the start of its file.
    assert lines[-3:] == [
        "[a2 r1] no timestamp here",
        "[a2 r0] 2024-05-01 09:00:00,000 INFO rank0 attempt two (clock skew)",
        "[a2 r1] 2024-05-01 11:00:00 INFO rank1 a2",
    ]
    assert len(lines) == 3 + 4 + 2 + 4 + 1 + 2


def test_first_error_skips_the_nccl_traceback(tmp_path: Path) -> None:
    m = LogMerger(make_logs(tmp_path / "run"))
    list(m)
    assert len(m.tracebacks) == 2
    first = m.first_error()
    assert first is not None and (first.attempt, first.rank) == (1, 0)
    assert first.text == VALUE_ERROR_TB


def test_rank_filter_and_only_nccl_fallback(tmp_path: Path) -> None:
    m = LogMerger(make_logs(tmp_path / "run"), rank=1)
    assert {ln.rank for ln in m} == {1}
    assert m.first_error() is not None and m.first_error().nccl


def test_cli_prints_first_error_last_and_errors_only(tmp_path: Path, capsys) -> None:
    run = make_logs(tmp_path / "run")
    assert logs.main([str(run), "--errors"]) == 0
    out = capsys.readouterr().out
    assert "INFO rank0 start" not in out and "[a1 r0] ValueError: data.path=/x" in out
    tail = out[out.index("First error") :]
    assert (
        "[a1 r0]" in tail and "ValueError: data.path=/x" in tail and "ProcessGroupNCCL" not in tail
    )


def test_submitit_files_split_into_attempts_by_ledger(tmp_path: Path) -> None:
    """A requeued job keeps its id and appends: lines after the gap belong to the next attempt."""
    run = tmp_path / "run"
    t1 = datetime(2024, 5, 1, 10, 0, 0).timestamp()
    ledger = [
        events.Started(time=t1, job_id="77", attempt=1),
        events.Requeued(time=t1 + 60, job_id="77", attempt=1),
        events.Started(time=t1 + 600, job_id="77", attempt=2),
    ]
    write(run / "ledger.jsonl", "\n".join(json.dumps(r.to_json()) for r in ledger))
    write(
        run / "logs" / "77_0_log.out",
        """
submitit INFO (2024-05-01 09:59:58,000) - Starting with JobEnvironment
2024-05-01 10:00:30,000 INFO step 5
submitit INFO (2024-05-01 10:09:55,000) - Starting with JobEnvironment
2024-05-01 10:10:30,000 INFO step 6
""",
    )
    tags = [ln.tag for ln in LogMerger(run)]
    assert tags == ["[a1 r0]", "[a1 r0]", "[a2 r0]", "[a2 r0]"]


def test_chained_traceback_is_one_block(tmp_path: Path) -> None:
    chained = (
        VALUE_ERROR_TB
        + """

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/app/slurmtrain/job.py", line 99, in run
    raise RuntimeError("resume failed")
RuntimeError: resume failed"""
    )
    write(tmp_path / "run" / "logs" / "attempt1.rank0.log", "x\n" + chained + "\nafter\n")
    m = LogMerger(tmp_path / "run")
    flags = [ln.in_traceback for ln in m]
    assert len(m.tracebacks) == 1 and m.tracebacks[0].text.endswith("RuntimeError: resume failed")
    assert flags[0] is False and flags[-1] is False and flags[1] is True


def test_only_the_files_asked_for_are_opened(tmp_path: Path, monkeypatch) -> None:
    run, opened, real_open = make_logs(tmp_path / "run"), [], open

    def spy(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    assert {ln.attempt for ln in LogMerger(run, attempt=2)} == {2}
    assert sorted(n for n in opened if n.endswith(".log")) == [
        "attempt2.rank0.log",
        "attempt2.rank1.log",
    ]
    opened.clear()
    assert {ln.rank for ln in LogMerger(run, rank=0, attempt=1)} == {0}
    assert [n for n in opened if n.endswith(".log")] == ["attempt1.rank0.log"]


def test_a_big_run_shows_its_newest_attempt_unless_asked(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for a in (1, 2):
        for r in range(logs.BIG_RUN // 2 + 1):
            write(run / "logs" / f"attempt{a}.rank{r}.log", f"2024-05-01 10:00:0{a} a{a} r{r}\n")
    m = LogMerger(run)
    assert {ln.attempt for ln in m} == {2} and len(m.files) == logs.BIG_RUN // 2 + 1
    assert m.note is not None and "--attempt" in m.note and "--all" in m.note
    assert {ln.attempt for ln in LogMerger(run, all_attempts=True)} == {1, 2}
    assert logs.main([str(run), "--all"]) == 0
    out = capsys.readouterr().out
    assert "[a1 r0] " in out and "[a2 r32] " in out and "Showing attempt" not in out
