"""Readers that cannot be knocked over (#37 Build 5): `status` and `logs` over a ledger holding each
bad input (a row without `event`, a line that is not a JSON object, a directory named `*.jsonl`,
an oversized line, another user's unreadable file) exit 0, show the good rows and say what they
skipped in one warning line; writers cap free text. Real files, a real second Unix user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from slurmtrain.cli import logs, status
from slurmtrain.common import events, jsonl_lines, read_skips
from slurmtrain.common.events import FailureClass
from slurmtrain.common.jsonl import iter_jsonl, tail_jsonl
from slurmtrain.common.row_codec import MAX_TEXT
from slurmtrain.common.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
OTHER = "st_reader"  # the second Unix user these tests create


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    read_skips.reset()
    monkeypatch.setenv("SLURMTRAIN_STATUS_CACHE", "off")
    yield
    read_skips.reset()


def _good_run(root: Path) -> RunDir:
    """A finished local run: config, ledger, metrics and a rank log, as a run writes them."""
    run = RunDir(root / "demo" / "3f2a9c1e77b0")
    (run.path / "logs").mkdir(parents=True)
    (run.path / "config.yaml").write_text("name: demo\n")
    rows = [
        events.Submitted(time=1.0, job_id="41", executor="local"),
        events.Started(time=2.0, job_id="41", attempt=1),
        events.Finished(time=9.0, job_id="41", attempt=1, step=20),
    ]
    (run.ledger_dir / "login.1.abc.jsonl").parent.mkdir(parents=True)
    (run.ledger_dir / "login.1.abc.jsonl").write_text(
        "".join(json.dumps(r.to_json()) + "\n" for r in rows)
    )
    (run.metrics).write_text(json.dumps({"step": 20, "time": 8.0, "valid_loss": 2.5}) + "\n")
    (run.logs / "41_0.out").write_text("step 10 loss 3.0\nstep 20 loss 2.5\n")
    return run


def _bad_inputs(run: RunDir, big: int = 2 << 20) -> None:
    """Each bad input of #37 Why 5 beside the good rows."""
    with open(run.ledger_dir / "login.1.abc.jsonl", "a") as f:
        f.write('{"time": 5.0, "job_id": "41"}\n')  # a row without `event`
        f.write("[1, 2, 3]\n")  # JSON, not an object
        f.write('{"event": "fini\\u0000 garbage\n')  # not JSON
    (run.ledger_dir / "odd.jsonl").mkdir()  # a directory named *.jsonl
    with open(run.ledger_dir / "big.2.def.jsonl", "w") as f:  # a line over the cap, then a good row
        f.write('{"event": "failed", "error": "' + "x" * big + '"}\n')
        f.write(json.dumps(events.Signal(time=3.0, signal="SIGUSR1").to_json()) + "\n")


def test_status_and_logs_skip_each_bad_input_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _good_run(tmp_path)
    _bad_inputs(run)
    assert status.main([str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["state"] == "finished" and row["step"] == 20 and row["valid_loss"] == 2.5
    [warning] = err.splitlines()
    assert warning.startswith("status: warning: skipped 5 unreadable lines/files under ")
    assert "big.2.def.jsonl:1: a line over 1,048,576 bytes" in warning  # the first, where
    assert [e.event for e in run.run_events()] == ["submitted", "started", "signal", "finished"]

    read_skips.reset()
    assert logs.main([str(run.path)]) == 0
    out, err = capsys.readouterr()
    assert "step 20 loss 2.5" in out
    assert len(err.splitlines()) == 1 and "logs: warning: skipped 5 " in err


def test_a_64_mib_line_is_skipped_without_reading_it_whole(tmp_path: Path) -> None:
    run = _good_run(tmp_path)
    _bad_inputs(run, big=64 << 20)
    t = time.perf_counter()
    rows = run.run_events()
    took = time.perf_counter() - t
    assert [e.event for e in rows] == ["submitted", "started", "signal", "finished"]
    assert took < 2.0, f"{took:.2f} s to read a ledger holding a 64 MiB line (#37: under 2 s)"


@pytest.mark.parametrize("block", [7, 64, 1000])
def test_block_edges_keep_every_good_row(
    tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short lines, a long one (over the cap) and a last line without newline, read forwards and
    backwards at block sizes that cut lines anywhere: the good rows, the long one skipped."""
    monkeypatch.setattr(jsonl_lines, "MAX_LINE", 100)
    monkeypatch.setattr(jsonl_lines, "BLOCK", block)
    path = tmp_path / "m.jsonl"
    good = [{"step": i, "pad": "y" * (i * 7 % 40)} for i in range(12)]
    lines = [json.dumps(r) for r in good]
    lines.insert(5, json.dumps({"step": -1, "pad": "z" * 300}))
    path.write_text("\n".join(lines))  # no final newline: kept, being complete JSON
    assert list(iter_jsonl(path)) == good
    assert list(tail_jsonl(path, block=block)) == good[::-1]
    assert read_skips.count() >= 1


def test_writers_cap_free_text_with_a_pointer_to_the_log() -> None:
    error = "Traceback (most recent call last):\n" + "  frame\n" * 200_000 + "RuntimeError: boom"
    row = events.Failed(cls=FailureClass.crash, error=error, traceback=error).to_json()
    for key in ("error", "traceback"):
        text = str(row[key])
        assert len(text) == MAX_TEXT and text.endswith("RuntimeError: boom")
        assert "characters cut; the whole text is in the run's logs/" in text
    assert events.Failed(cls=FailureClass.crash, error="short").to_json()["error"] == "short"


def _other_user() -> str:
    """A second Unix user (created once; CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user")
    if subprocess.run(["id", "-u", OTHER], capture_output=True).returncode != 0:
        for _ in range(5):  # /etc/passwd may be locked by another useradd a moment
            made = subprocess.run(["useradd", "-M", "-s", "/bin/sh", OTHER], capture_output=True)
            if made.returncode in (0, 9):  # 9: it exists (made beside us)
                break
            time.sleep(0.5)
    return OTHER


# Runs a command as OTHER: python and what it imports are loaded as root first (the interpreter
# lives under /root, 0700 here), then the process drops to OTHER and reads the run.
AS_OTHER = """
import contextlib, io, os, pwd, sys
from slurmtrain.cli import logs, status
from slurmtrain.common import read_skips
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    status.main([sys.argv[3]]), logs.main([sys.argv[4]])  # lazy imports done, as root
read_skips.reset()
user = pwd.getpwnam(sys.argv[1])
os.setgroups([]), os.setgid(user.pw_gid), os.setuid(user.pw_uid)
command = {"status": status.main, "logs": logs.main}[sys.argv[2]]
sys.exit(command(sys.argv[5:]))
"""


def test_another_users_unreadable_files_are_skipped() -> None:
    user = _other_user()
    where = Path(tempfile.mkdtemp(prefix="tolerant."))
    try:
        where.chmod(0o755)
        run = _good_run(where)
        secret = run.ledger_dir / "other.9.fff.jsonl"
        secret.write_text(json.dumps(events.Signal(time=4.0, signal="SIGTERM").to_json()) + "\n")
        secret.chmod(0o000)
        (run.logs / "41_1.err").write_text("theirs\n")
        (run.logs / "41_1.err").chmod(0o000)
        (where / "theirs" / "0123").mkdir(parents=True)
        (where / "theirs").chmod(0o700)  # a name directory of another user's
        env = dict(os.environ, SLURMTRAIN_STATUS_CACHE="off")
        cmd = [sys.executable, "-c", AS_OTHER, user]

        def as_other(*argv: str) -> subprocess.CompletedProcess[str]:
            both = [str(where), str(run.path)]
            return subprocess.run(
                [*cmd, argv[0], *both, *argv[1:]], env=env, cwd=REPO, capture_output=True, text=True
            )

        got = as_other("status", str(where), "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["state"] == "finished"
        assert got.stderr.count("\n") == 1, got.stderr
        assert (
            "status: warning: skipped 2 unreadable" in got.stderr
            and "PermissionError" in got.stderr
        )
        got = as_other("logs", str(run.path))
        assert got.returncode == 0, got.stderr
        assert "step 20 loss 2.5" in got.stdout
        assert got.stderr.count("\n") == 1, got.stderr
        assert "logs: warning: skipped 2 unreadable lines/files" in got.stderr
    finally:
        shutil.rmtree(where, ignore_errors=True)
