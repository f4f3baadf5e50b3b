"""The login path stays light: composing, validating and planning never import torch & co."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import run_cli, slurmtrain_env

HEAVY = ("torch", "deepspeed", "transformers")


def test_dry_run_of_a_big_model_prints_the_plan(workdir):
    done = run_cli(["model=opt13b", "nodes=64", "dry_run=true"], cwd=workdir)
    # Planned and shown, then refused as the real submission is (issue 35): exit 2, one line.
    assert done.returncode == 2, done.stderr
    assert "nodes=64: the local executor runs on this machine only" in done.stderr
    config = re.findall(r"full config \(or --cfg job\):\s+(\S+)", done.stdout)[0]
    assert "num_layers: 40" in Path(config).read_text()  # the plan is printed, the config written
    assert "plan:" in done.stdout and "world size 128" in done.stdout  # 64 nodes x 2 CPU tasks
    assert not (workdir / "runs").exists()


def test_login_path_does_not_import_heavy_modules(workdir):
    code = f"""
import sys
from hydra import compose, initialize_config_dir
from slurmtrain.common import schema, validation
schema.register()
from slurmtrain.planning import preflight
from slurmtrain.common import rundir
with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
    cfg = compose("config", overrides=["model=opt13b", "nodes=64", "cluster=local",
                                       "gpus_per_node=0"])
validation.validate_config(cfg, submitting=False)
preflight.report(cfg)
rundir.fingerprint(cfg)
import slurmtrain.login.submit, slurmtrain.login.local_submit
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=workdir,
        env=slurmtrain_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
