"""An attempt's `import deepspeed` does not pay for mlflow (DeepSpeed's autotuner imports it when
installed: 0.7 s per rank at every start) unless the run logs to MLflow; mlflow still imports
normally afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

pytest.importorskip("mlflow")
pytest.importorskip("deepspeed")

PROBE = """
import sys
from omegaconf import OmegaConf
from slurmtrain.compute import deepspeed_compat
cfg = OmegaConf.create({"logger": %s})
with deepspeed_compat.deepspeed_without_mlflow(cfg):
    import deepspeed
print("after deepspeed:", "mlflow" in sys.modules)
import mlflow  # still importable afterwards
print("later:", mlflow.__name__)
"""


@pytest.mark.parametrize(
    "logger, imported", [({"tensorboard": {}}, False), ({"mlflow": {"tracking_uri": None}}, True)]
)
def test_deepspeed_imports_mlflow_only_for_runs_that_log_to_it(logger, imported):
    out = subprocess.run(
        [sys.executable, "-c", PROBE % OmegaConf.to_container(OmegaConf.create(logger))],
        capture_output=True,
        text=True,
        env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"after deepspeed: {imported}" in out.stdout, out.stdout
    assert "later: mlflow" in out.stdout
