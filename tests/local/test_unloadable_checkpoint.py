"""A checkpoint that validates but fails to load (issue #20 item 8): the attempt records
`checkpoint_unloadable` (step and DeepSpeed's error), marks it so no later attempt tries it again,
and loads the previous valid checkpoint in the same attempt.

The damage is one a buggy writer makes: the model-state file holds a pickle DeepSpeed rejects,
and the manifest was rewritten over it, so sizes and checksums match. Before: every attempt
crashed loading it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from slurmtrain.compute.checkpoint import select
from slurmtrain.compute.checkpoint.format import CHECKSUM, MANIFEST, _digest, validate
from tests.conftest import ledger_events, read_jsonl, run_cli, run_dirs

BASE = ["train.max_steps=30", "train.log_interval=1", "checkpoint.interval_steps=10"]
STATES = "mp_rank_00_model_states.pt"


def events(run: Path, kind: str) -> list[dict]:
    return [e for e in ledger_events(run) if e["event"] == kind]


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
    assert events(run, "paused"), paused.stdout + paused.stderr
    ckpts = run / "checkpoints"
    make_unloadable(ckpts / "step_20")
    assert validate(ckpts / "step_20", full=True) is None  # the manifest check cannot see it

    done = run_cli(BASE, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    [bad] = events(run, "checkpoint_unloadable")
    assert bad["step"] == 20 and bad["error"], bad
    [loaded] = events(run, "checkpoint_loaded")
    assert loaded["step"] == 10 and loaded["attempt"] == 2
    assert events(run, "finished") and not events(run, "failed")
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["attempt"] == 2]
    assert steps == list(range(11, 31))  # from step 10, in the same attempt

    # The mark outlives the attempt: the next choice skips step_20 without loading it again
    # (the run's later saves are newer, so look at step_20 against step_10 alone).
    for newer in ("step_30",):
        (ckpts / newer).rename(ckpts / f"{newer}.aside")
    choice = select.choose(ckpts, ledger_events(run), "auto", full=True)
    assert choice.found.path is not None and choice.found.path.name == "step_10"
    assert any(
        Path(p).name == "step_20" and "failed to load" in why for p, why in choice.found.skipped
    )
