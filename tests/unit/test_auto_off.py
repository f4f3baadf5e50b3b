"""SLURMTRAIN_AUTO=off beside an explicit cluster=slurm (issue 35): gpus_per_node=auto is the
partition's when a controller answers (tests/cluster/test_dry_run_refused.py), and 0 as before
when none does (no sbatch on PATH: a laptop, CI)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.login import placement

schema.register()


def test_without_a_controller_off_still_means_cpu_ranks(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    monkeypatch.setattr(placement, "_probe_cache", {})
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm"])
    placement.resolve_auto(cfg)
    assert cfg.gpus_per_node == 0 and cfg.cluster.kind == "slurm"
    assert placement._probe_cache["slurm-asked"].why == "no sbatch on PATH"
