"""What a plain `python -m slurmtrain KEY=VALUE ...` pays before it can answer: one composition of
the config, not Hydra's two, and only the modules its path uses (bench/dry_run_speed.py has the
figure; no timed assertions here)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT, slurmtrain_env

# Runs `python -m slurmtrain ARGS` in-process, counting Hydra's compositions and recording which
# modules were imported by the time the command ends.
PROBE = """
import atexit, json, runpy, sys
from hydra._internal.hydra import Hydra
composed = []
compose = Hydra.compose_config
def counting(self, *args, **kwargs):
    composed.append(kwargs.get("run_mode"))
    return compose(self, *args, **kwargs)
Hydra.compose_config = counting
atexit.register(lambda: print("PROBE" + json.dumps(
    {"composed": len(composed), "modules": sorted(sys.modules)}), flush=True))
sys.argv = ["slurmtrain", *json.loads(sys.argv[1])]
runpy.run_module("slurmtrain", run_name="__main__")
"""


def _probe(args: list[str], cwd) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        cwd=cwd,
        env=slurmtrain_env({"SLURMTRAIN_AUTO": "off"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE")]
    assert lines, done.stdout + done.stderr
    return {"returncode": done.returncode, "stdout": done.stdout, **json.loads(lines[-1][5:])}


def test_a_plain_dry_run_composes_the_config_once(tmp_path):
    got = _probe(["model=opt125m", "nodes=1", "dry_run=true", f"runs_root={tmp_path}"], tmp_path)
    assert got["returncode"] == 0, got["stdout"]
    assert got["composed"] == 1  # Hydra's get_mode composed it a second time to read hydra.mode


def test_hydra_mode_on_the_command_line_still_chooses_a_sweep(tmp_path):
    args = ["hydra.mode=MULTIRUN", "optim.lr=1e-3,2e-3", "dry_run=true", f"runs_root={tmp_path}"]
    got = _probe(args, tmp_path)
    assert got["returncode"] == 0, got["stdout"]
    assert got["stdout"].count("ok      optim.lr=") == 2, got["stdout"]  # a line a point


def test_the_shipped_config_leaves_hydra_mode_to_the_command_line():
    """The single-composition shortcut (slurmtrain/__main__.py) relies on it."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(ROOT / "conf" / "config.yaml")
    assert OmegaConf.select(config, "hydra.mode") is None


def test_the_schema_imports_no_hydra():
    """Workers and the `cli` commands load run configs through the schema; only composing (the
    login command, its sweeps) needs Hydra's config store, ~90 ms of imports."""
    code = "import sys, slurmtrain.common.schema; print(sorted(m for m in sys.modules if m.split('.')[0] == 'hydra'))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=slurmtrain_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
