"""Checkpoints on the real cluster: SIGKILL mid-save, flipped bytes, a 2-node -> 1-node resume.

Every run is 2 nodes x 1 CPU rank (fp32, global batch 8), so an uninterrupted 2-node run is the
reference for all three: same world size -> the same losses bitwise; after a resume on 1 node
(grad accumulation 2 instead of 1) -> within 1e-5. The reference trains beside the first test's
run (4 nodes: 2 + 2).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    CheckpointConverted,
    CheckpointLoaded,
    CheckpointSkipped,
    Finished,
    Paused,
    Started,
    Submitted,
)
from tests.cluster.helpers import only_run, wait_event, wait_job_gone, wait_until
from tests.conftest import ledger_of, read_jsonl, run_cli

pytestmark = pytest.mark.slurm
BASE = [
    "cluster=slurm",
    "cluster.cpu_tasks_per_node=1",
    "train.log_interval=1",
    "train.max_steps=30",
    "checkpoint.interval_steps=10",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "nodes=2",
]
SHARD = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def submit(workdir: Path, name: str, args: list[str] = (), inject: str = "") -> Path:
    env = {"SLURMTRAIN_INJECT": inject} if inject else None
    opt_in = ["faults.allow_inject=true"] if inject else []
    done = run_cli(BASE + [f"name={name}", *args, *opt_in], cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run(workdir / "runs", name)


def losses(run: Path) -> dict[int, float]:
    """Loss by step; a step computed twice (before and after a resume) keeps its last value."""
    return {row["step"]: row["loss"] for row in read_jsonl(run / "metrics.jsonl")}


def paused_at_20(workdir: Path, name: str) -> Path:
    """A run that saved step_20 and ended (train.pause_at_step), its job gone from the queue."""
    run = submit(workdir, name, ["train.pause_at_step=20"])
    [paused] = wait_event(run, Paused, timeout=400)
    assert paused.step == 20 and (run / "checkpoints" / "step_20" / "manifest.json").exists()
    wait_job_gone(ledger_of(run, Submitted)[-1].job_id)
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Submitted at once; each test waits for it to finish."""
    return submit(tmp_path_factory.mktemp("reference"), "ckref")


def finished(run: Path) -> Path:
    wait_event(run, Finished, timeout=600)
    return run


def test_sigkill_of_every_rank_mid_save_never_loads_the_partial_checkpoint(reference, workdir):
    # every rank dies without a word: the supervisor waits node_check_s for a down node (none is
    # down here: the wait only delays the restart; production's default is SlurmdTimeout + 30 s)
    run = submit(
        workdir, "killsave", ["faults.node_check_s=12"], inject="kill_during_save=20,attempts=1"
    )
    finished(run)
    attempts = {e.attempt for e in ledger_of(run, Started)}
    assert attempts == {1, 2}, attempts
    [ended] = [e for e in ledger_of(run, AttemptEnded) if e.attempt == 1]
    assert ended.cls != Finished.kind
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.attempt == 2 and loaded.step == 10  # step_20.tmp was never a candidate
    assert loaded.path.endswith("/step_10")
    assert ledger_of(run, CheckpointSkipped) == []
    assert not list((run / "checkpoints").glob("*.tmp"))  # the partial save was cleared
    assert losses(run) == losses(finished(reference))  # bitwise: fp32, same world size


def test_flipped_bytes_in_the_newest_checkpoint_load_the_previous_one(reference, workdir):
    run = paused_at_20(workdir, "flipped")
    shard = run / "checkpoints" / "step_20" / SHARD
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    run_again = submit(workdir, "flipped")
    assert run_again == run
    finished(run)
    [skipped] = ledger_of(run, CheckpointSkipped)
    assert skipped.path.endswith("/step_20") and "checksum mismatch" in skipped.reason
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 10 and loaded.path.endswith("/step_10")
    assert losses(run) == losses(finished(reference))


def test_two_node_run_resumes_on_one_node_with_the_same_global_batch(reference, workdir):
    run = paused_at_20(workdir, "shrink")
    # Three of the four nodes are busy: `nodes=1-2` starts at once on the one that is free.
    hog = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N3",
            "--exclusive",  # nodes are shared otherwise: the range would still find two
            "--job-name=st-hog",
            "--output=/dev/null",
            "--wrap",
            "sleep 600",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        wait_until(
            lambda: (
                subprocess.run(
                    ["squeue", "-h", "-j", hog, "-o", "%T"], capture_output=True, text=True
                ).stdout.strip()
                == "RUNNING"
            ),
            120,
            "the 3-node hog to run",
        )
        done = run_cli(BASE[:-1] + ["name=shrink", "nodes=1-2"], cwd=workdir)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_event(run, CheckpointLoaded, timeout=400)
    finally:
        subprocess.run(["scancel", hog], capture_output=True)
    finished(run)
    assert [e.world_size for e in ledger_of(run, Started)] == [2, 1]
    [converted] = ledger_of(run, CheckpointConverted)
    assert (converted.step, converted.from_world_size, converted.to_world_size) == (
        20,
        2,
        1,
    )
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 20 and loaded.world_size_changed is True
    config = (run / "config.yaml").read_text()
    assert "global_batch_size: 8" in config
    want, got = losses(finished(reference)), losses(run)
    assert sorted(got) == list(range(1, 31))
    assert all(got[s] == want[s] for s in range(1, 21))
    worst = max(abs(got[s] - want[s]) for s in range(21, 31))
    assert worst <= 1e-5, f"largest loss difference after the 2 -> 1 node resume: {worst:.2e}"
