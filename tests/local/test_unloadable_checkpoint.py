"""A checkpoint that validates but fails to load: the attempt records
`checkpoint_unloadable` (step and DeepSpeed's error), marks it so no later attempt tries it again,
and loads the previous valid checkpoint in the same attempt.

The damage is one a buggy writer makes: the model-state file holds a pickle DeepSpeed rejects,
and the manifest was rewritten over it, so sizes and checksums match: only the load can tell.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slurmtrain.common.checkpoint_format import CHECKSUM, MANIFEST, _digest, validate
from slurmtrain.common.events import (
    CheckpointLoaded,
    CheckpointSkipped,
    CheckpointUnloadable,
    Failed,
    Finished,
    Paused,
)
from slurmtrain.compute.checkpoint import select
from tests.conftest import ledger_of, read_jsonl, run_cli, run_dirs

BASE = ["train.max_steps=30", "train.log_interval=1", "checkpoint.interval_steps=10"]
STATES = "mp_rank_00_model_states.pt"


def make_unloadable(step_dir: Path) -> None:
    """A well-formed torch file without the engine's keys, listed truthfully in the manifest."""
    torch.save({"not": "a DeepSpeed checkpoint"}, step_dir / STATES)
    manifest = json.loads((step_dir / MANIFEST).read_text())
    entry = manifest["files"][STATES]
    entry["size"] = (step_dir / STATES).stat().st_size
    entry[CHECKSUM] = _digest(step_dir / STATES)
    (step_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))


def test_checkpoint_that_fails_to_load_is_marked_and_the_previous_one_loads(workdir):
    paused = run_cli(BASE + ["train.pause_at_step=20"], cwd=workdir)
    [run] = run_dirs(workdir / "runs")
    assert ledger_of(run, Paused), paused.stdout + paused.stderr
    ckpts = run / "checkpoints"
    make_unloadable(ckpts / "step_20")
    assert validate(ckpts / "step_20", full=True) is None  # the manifest check cannot see it

    # Stops at step 15, so step_20 (marked now) is not saved again over the damaged one.
    second = run_cli(BASE + ["train.pause_at_step=15"], cwd=workdir)
    assert len(ledger_of(run, Paused)) == 2, second.stdout + second.stderr
    [bad] = ledger_of(run, CheckpointUnloadable)
    assert bad.step == 20 and "KeyError" in bad.error, bad
    [loaded] = ledger_of(run, CheckpointLoaded)
    assert loaded.step == 10 and loaded.attempt == 2
    assert not ledger_of(run, Failed)
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["attempt"] == 2]
    assert steps == list(range(11, 16))  # from step 10, in the same attempt
    assert (ckpts / "step_20" / select.UNLOADABLE).is_file()

    # The next attempt skips the marked step_20 without loading it again (the newest, and it
    # still validates) and resumes from step 15.
    third = run_cli(BASE, cwd=workdir)
    assert third.returncode == 0, third.stdout + third.stderr
    assert len(ledger_of(run, CheckpointUnloadable)) == 1
    loaded = [e for e in ledger_of(run, CheckpointLoaded) if e.attempt == 3]
    assert [e.step for e in loaded] == [15]
    skipped = [e for e in ledger_of(run, CheckpointSkipped) if e.attempt == 3]
    assert [Path(e.path).name for e in skipped] == ["step_20"]
    assert "failed to load" in skipped[0].reason
    assert ledger_of(run, Finished)
