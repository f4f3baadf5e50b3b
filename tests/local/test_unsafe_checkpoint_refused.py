"""`sample` and `export` (one loader: compute/weights.py) of a checkpoint holding a pickled object torch's weights-only loader
refuses (issue 37, build 6): one line naming the file and the global, exit 2, the object never
unpickled. They printed torch's 36-line traceback advising weights_only=False."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from slurmtrain.common.checkpoint_format import CHECKSUM, MANIFEST, _digest
from tests.plans import planned

STATES = "mp_rank_00_model_states.pt"


class Planted:
    """Unpickling it (weights_only=False) runs `touch <marker>`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def planted_run(tmp_path: Path, marker: Path, optim: bool) -> Path:
    """A run directory whose one checkpoint validates (its manifest sealed over the file, as
    anyone with write access to the runs root could) and holds the planted object; `optim`: a
    ZeRO optimizer file beside it, so DeepSpeed's zero_to_fp32 is the loader."""
    cfg = planned(tmp_path, "cluster=local", "gpus_per_node=0")
    run = tmp_path / "runs" / "opt_tiny" / "0123456789ab"
    step = run / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    OmegaConf.save(cfg, run / "config.yaml")
    torch.save({"module": {}, "planted": Planted(marker)}, step / STATES)
    names = [STATES]
    if optim:
        torch.save({}, step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        names.append("zero_pp_rank_0_mp_rank_00_optim_states.pt")
    files = {n: {"size": (step / n).stat().st_size, CHECKSUM: _digest(step / n)} for n in names}
    manifest = {"files": files, "step": 2, "world_size": 1, "zero_stage": 2 if optim else 0}
    (step / MANIFEST).write_text(json.dumps(manifest))
    return run


@pytest.fixture(autouse=True)
def _enforced_only_here(monkeypatch):
    """enforce() sets a process-wide override: undone after each test (monkeypatch restores)."""
    from slurmtrain.compute.checkpoint import safe_load

    monkeypatch.setenv(safe_load.FORCE, "0")
    monkeypatch.setattr(safe_load, "_enforced", False)


def test_our_own_load_refuses_an_unsafe_model_states_file_in_one_line(tmp_path):
    """ZeRO-0 fp32: slurmtrain's own weights-only load (compute/checkpoint/safe_load.py)."""
    from slurmtrain.compute import weights

    marker = tmp_path / "ran"
    step = planted_run(tmp_path, marker, optim=False) / "checkpoints" / "step_2"
    with pytest.raises(weights.ExportError) as err:
        weights.lazy_state_dict(step)
    assert str(err.value).startswith(
        f"{step / STATES}: holds pickled objects torch's safe loader refuses (posix.system); "
        f"not loaded"
    ), err.value
    assert "\n" not in str(err.value) and not marker.exists()


def test_export_through_zero_to_fp32_refuses_it_in_one_line_exit_2(tmp_path, monkeypatch, capsys):
    """ZeRO 1-3: DeepSpeed's zero_to_fp32 loads (weights_only=False, overridden), through the
    export command's own entry point, in-process (a CLI process would only add its start-up)."""
    from slurmtrain.cli.__main__ import main

    for name, value in (("DS_ACCELERATOR", "cpu"), ("PYTHONWARNINGS", "ignore")):
        monkeypatch.setenv(name, value)  # what export's quiet() sets, undone after the test
    marker = tmp_path / "ran"
    run = planted_run(tmp_path, marker, optim=True)
    states = run / "checkpoints" / "step_2" / STATES
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "weights_only=False" not in err
    [line] = [ln for ln in err.splitlines() if ln.startswith("slurmtrain export: ")]
    assert line.startswith(
        f"slurmtrain export: {states}: holds pickled objects torch's safe loader refuses "
        f"(posix.system); not loaded"
    ), line
    assert "--step N (checkpoints: step_2)" in line
    assert not marker.exists()  # never unpickled
