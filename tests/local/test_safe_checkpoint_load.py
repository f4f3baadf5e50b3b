"""Checkpoints load weights-only: a checkpoint file that carries a pickled object whose
`__reduce__` runs a command is refused at load (ours and DeepSpeed's), and the command never runs
on any rank."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from slurmtrain.common.events import CheckpointLoaded, CheckpointUnloadable, Finished, Paused
from tests.conftest import ledger_of, run_cli, run_dirs

BASE = ["train.max_steps=30", "train.log_interval=1", "checkpoint.interval_steps=10"]


class Planted:
    """Unpickling it (weights_only=False) runs `touch <marker>`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(step_dir: Path, name: str, marker: Path) -> None:
    """Add the object to one file of a published checkpoint and re-seal its manifest entry, as
    someone with write access to the runs root could: the checksum still matches."""
    import torch

    from slurmtrain.common.checkpoint_format import _digest

    path = step_dir / name
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own, trusted file
    state["planted"] = Planted(marker)
    torch.save(state, path)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"][name] = {"size": path.stat().st_size, "crc32": _digest(path)}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(autouse=True)
def _enforced_only_here(monkeypatch):
    """enforce() sets a process-wide override: undone after each test (monkeypatch restores)."""
    from slurmtrain.compute.checkpoint import safe_load

    monkeypatch.setenv(safe_load.FORCE, "0")
    monkeypatch.setattr(safe_load, "_enforced", False)


def test_a_planted_object_is_refused_at_load_and_never_runs(workdir, tmp_path):
    import torch

    from slurmtrain.compute.checkpoint import safe_load

    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(2), "planted": Planted(marker)}, evil)
    with pytest.raises(pickle.UnpicklingError):
        safe_load.load(evil)
    # DeepSpeed's own loads pass weights_only=False: the enforced override still refuses them.
    with pytest.raises(pickle.UnpicklingError):
        torch.load(evil, weights_only=False)
    assert not marker.exists()


def test_a_clean_resume_loads_weights_only_and_a_planted_checkpoint_is_refused(workdir, tmp_path):
    first = run_cli(BASE + ["train.pause_at_step=10"], cwd=workdir)
    [run] = run_dirs(workdir / "runs")
    assert ledger_of(run, Paused), first.stdout + first.stderr
    # A normal resume: model, optimizer and RNG files all load through the weights-only path.
    second = run_cli(BASE + ["train.pause_at_step=20"], cwd=workdir)
    assert [e.step for e in ledger_of(run, CheckpointLoaded)] == [10], second.stdout
    assert len(ledger_of(run, Paused)) == 2, second.stdout + second.stderr

    marker = tmp_path / "ran"
    plant(run / "checkpoints" / "step_20", "mp_rank_00_model_states.pt", marker)
    plant(run / "checkpoints" / "step_20", "rng_rank0.pt", marker)
    third = run_cli(BASE, cwd=workdir)
    out = third.stdout + third.stderr
    assert not marker.exists(), out  # the planted command never ran, on any rank
    # Refused, recorded, and the previous checkpoint loaded instead (compute/recovery.py).
    [refused] = ledger_of(run, CheckpointUnloadable)
    assert refused.step == 20 and "Weights only load failed" in refused.error, out
    assert "posix.system" in refused.error, out
    assert [e.step for e in ledger_of(run, CheckpointLoaded)][-1] == 10, out
    assert ledger_of(run, Finished), out


def test_every_type_deepspeed_and_the_rng_files_pickle_loads_weights_only(tmp_path):
    """The allow-list: ZeRO optimizer states (stage enum, fp16 dynamic and static loss scalers,
    fragment addresses), model states (torch.Size in OrderedDicts) and numpy's RNG state."""
    from collections import OrderedDict

    import numpy as np
    import torch
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from slurmtrain.compute.checkpoint import safe_load

    state = {
        "zero_stage": ZeroStageEnum.gradients,
        "dynamic": DynamicLossScaler(2.0**16, 1000, 1.0, 2, False),
        "static": LossScaler(128.0),
        "address": fragment_address(numel=4, start=8),
        "param_shapes": [OrderedDict(w=torch.Size([2, 3]))],
        "numpy": np.random.get_state(),
        "ds_version": "0.19.8",
    }
    torch.save(state, tmp_path / "states.pt")
    back = safe_load.load(tmp_path / "states.pt")
    assert back["zero_stage"] == ZeroStageEnum.gradients and back["dynamic"].cur_scale == 2.0**16
    assert back["static"].cur_scale == 128.0 and back["address"].start == 8
    assert np.array_equal(back["numpy"][1], state["numpy"][1])
