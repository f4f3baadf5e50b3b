"""Site profiles (issue 35, build 8): `site=NAME` (conf/site/) holds one site's partition,
account, environment, container and binds. Each shipped profile renders the committed batch script
(tests/unit/data/site_scripts/NAME.sbatch), its volatile parts normalized: the runs root, the
submitting Python, the run's fingerprint and tag. SLURMTRAIN_UPDATE_SITE_SCRIPTS=1 rewrites them
(review the diff). tests/cluster/test_site_profiles_slurm.py hands them to the local Slurm's
`sbatch --test-only`.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.rundir import locate
from slurmtrain.login import placement, slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()
SITES = ("rocm_apptainer", "pyxis_efa", "conda_modules")
EXPECTED = Path(__file__).parent / "data" / "site_scripts"


def site_cfg(site: str, runs_root: Path, *overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"site={site}", "cluster=slurm", f"runs_root={runs_root}", *overrides],
        )
    return resolve(cfg)


def normalized(text: str, runs_root: Path) -> str:
    text = text.replace(str(runs_root), "RUNS_ROOT").replace(sys.executable, "PYTHON")
    text = re.sub(r"opt_tiny/[0-9a-f]{12}", "opt_tiny/FINGERPRINT", text)
    text = re.sub(r"(--job-name=st-opt_tiny)-[0-9a-f]{8}", r"\1-FP8", text)  # a run's own name
    return re.sub(r"(--comment=slurmtrain:opt_tiny/FINGERPRINT)@[0-9a-f]{8}", r"\1@TAG", text)


@pytest.mark.parametrize("site", SITES)
def test_site_profile_renders_the_committed_script(tmp_path, monkeypatch, site):
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")  # no partition asked: the same script anywhere
    monkeypatch.setattr(placement, "_probe_cache", {})
    runs = tmp_path / "runs"
    cfg = site_cfg(site, runs)
    text = normalized(slurm_submit.render_sbatch(cfg, locate(cfg)), runs)
    expected = EXPECTED / f"{site}.sbatch"
    if os.environ.get("SLURMTRAIN_UPDATE_SITE_SCRIPTS"):
        expected.write_text(text)
    assert text == expected.read_text(), f"{site}: rendered script differs from {expected}"


def test_site_none_is_the_default_and_changes_nothing(tmp_path):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        default = compose("config", overrides=["cluster=slurm"])
        none = compose("config", overrides=["cluster=slurm", "site=none"])
    assert default == none


def test_command_line_keys_win_over_the_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")
    monkeypatch.setattr(placement, "_probe_cache", {})
    cfg = site_cfg("rocm_apptainer", tmp_path, "cluster.partition=small-g", "gpus_per_node=2")
    assert (cfg.cluster.partition, cfg.gpus_per_node) == ("small-g", 2)
    assert cfg.cluster.apptainer_gpu == "rocm"  # the rest of the profile stays
