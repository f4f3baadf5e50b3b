"""Phase deadlines through the real entrypoint: a save has its own deadline, not the step's.

`shard_delay` (compute/faults/inject.py) makes every shard of a save slow, like a slow disk.
"""

from __future__ import annotations

import socket
from pathlib import Path

from slurmtrain.common.events import CheckpointSaved, Deadlines, Failed, FailureClass, Finished
from tests.conftest import dry_run_file, ledger_events, ledger_of, run_cli, run_dirs

BASE = ["train.max_steps=20", "train.log_interval=1", "checkpoint.interval_steps=10"]


def _hangs(run: Path) -> list[Failed]:
    return [e for e in ledger_of(run, Failed) if e.cls == FailureClass.hang]


def test_a_save_longer_than_the_step_hang_window_is_not_a_hang(tmp_path):
    """Each save takes >= 16 s on every rank (2-3 shards of 8 s); steps may hang for 12 s."""
    done = run_cli(
        BASE + ["faults.hang_timeout_s=12", "faults.allow_inject=true"],
        cwd=tmp_path,
        env={"SLURMTRAIN_INJECT": "shard_delay=8"},
    )
    [run] = run_dirs(tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not _hangs(run)
    events = ledger_events(run)
    assert [e.step for e in events if isinstance(e, CheckpointSaved)] == [10, 20]
    assert any(isinstance(e, Finished) for e in events)
    [limits] = [e for e in events if isinstance(e, Deadlines)]
    assert limits.step_s == 12 and limits.io_floor_s == 300


def test_a_rank_stalled_in_a_save_is_killed_after_the_save_deadline_not_the_step_s(tmp_path):
    """Steps may hang for 600 s; the save (a few MB) may go 3 s without a beat: a shard that
    stalls for 120 s ends the attempt as a hang in phase `save` long before 600 s."""
    done = run_cli(
        BASE + ["faults.hang_timeout_s=600", "faults.io_floor_s=3", "faults.allow_inject=true"],
        cwd=tmp_path,
        env={"SLURMTRAIN_INJECT": "shard_delay=120"},
        timeout=400,
    )
    [run] = run_dirs(tmp_path / "runs")
    assert done.returncode != 0
    hangs = _hangs(run)
    assert hangs, done.stderr[-3000:]
    for row in hangs:
        assert row.phase == "save" and "(phase save, deadline 3" in row.error, row
    dumps = sorted((run / "hangs").glob("attempt1.*.txt"))  # one file per node
    assert dumps and all(d.read_text().startswith("==== rank ") for d in dumps)
    assert all("no progress for" in d.read_text() for d in dumps)
    assert not (run / "checkpoints" / "step_10").exists()  # nothing half-written is published


def test_a_rank_stuck_in_the_rendezvous_is_a_hang_of_that_phase(tmp_path):
    """Rank 0 of 2 started alone: the rendezvous never completes. The start-up watchdog ends it
    after `faults.startup_timeout_s` (the collective timeout is 1800 s), with a row that names
    the phase, job id and restart count (no attempt number yet) and its stacks in hangs/."""
    # 20 s: this rank's imports (torch, deepspeed) must be over before it waits to join, also on
    # two busy cores; the wait for the absent rank 1 is what then runs out.
    dry = run_cli(["faults.startup_timeout_s=20", "dry_run=true"], cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dry_run_file(dry.stdout).read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(port), "JOB_ID": "77"}
    done = run_cli(
        [str(run)], cwd=tmp_path, env=env, module="slurmtrain.compute.attempt", timeout=300
    )
    assert done.returncode == 5, done.stderr[-3000:]  # EXIT_HANG
    [row] = _hangs(run)
    assert (
        row.phase == "startup:rendezvous"
        and "(phase startup:rendezvous, deadline 20 s)" in row.error
    )
    assert row.job_id == "77" and row.restart == 0 and row.attempt is None
    # it waited for a rank that never joined: its own node is not the one to blame
    assert row.node is None and row.host and "waiting for ranks to join" in row.error
    [dump] = (run / "hangs").glob("startup.job77.restart0.*.txt")  # its node's file
    assert dump.read_text().startswith("==== rank 0 ====\nno progress for")
