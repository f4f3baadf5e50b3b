"""Plans made in-process as the login node's dry run makes them: the planner's test modules share
these, with `pytestmark = pytest.mark.usefixtures("no_slurm")` (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from slurmtrain.common import schema
from slurmtrain.login.prepare import resolve
from slurmtrain.planning import preflight

schema.register()
GiB = 2**30


def composed(tmp_path: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        return compose("config", overrides=[f"runs_root={tmp_path}", *overrides])


def planned(tmp_path: Path, *overrides: str) -> DictConfig:
    """The config as `check` plans it (composed, then resolved: auto keys filled)."""
    return resolve(composed(tmp_path, *overrides))


def plan_line(report: preflight.PlanReport, start: str) -> str:
    """The report's one line that starts with `start`."""
    found = [ln for ln in report.lines if ln.startswith(start)]
    assert len(found) == 1, report.text
    return found[0]
