"""The shipped site profiles (conf/site/) through the local Slurm's `sbatch --test-only` (issue 35,
build 8): the dry run's own path (login/dry_run.show), in-process, with the local partition and
gpus_per_node=0 over each profile's; everything else (account, qos, exclusive, env, container
flags and binds) as shipped. The images do not exist here and --test-only runs no step: the
container lines are checked as rendered text (tests/unit/test_site_profiles.py)."""

from __future__ import annotations

import io

import pytest

from slurmtrain.login import dry_run, placement
from tests.conftest import dry_run_file
from tests.unit.test_site_profiles import SITES, site_cfg

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("site", SITES)
def test_site_profile_passes_sbatch_test_only(slurm_cluster, tmp_path, monkeypatch, site):
    monkeypatch.setattr(placement, "_probe_cache", {})
    partition = sorted(slurm_cluster.partitions)[0]
    cfg = site_cfg(site, tmp_path / "runs", f"cluster.partition={partition}", "gpus_per_node=0",
                   "dry_run=true")  # fmt: skip
    out = io.StringIO()
    code = dry_run.show(cfg, out)
    text = out.getvalue()
    assert code == 0, text[-3000:]
    assert "slurmtrain: dry run: Slurm says: sbatch: Job" in text, text[-3000:]
    script = dry_run_file(text, "script").read_text()  # the dry run writes it and names it
    assert f"#SBATCH --partition={partition}" in script
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
