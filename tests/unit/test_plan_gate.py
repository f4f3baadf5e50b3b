"""The memory plan gates submission: a misfit refuses with the fitting setting; that setting passes."""

from __future__ import annotations

import re

from tests.conftest import run_cli

BIG = ["model=opt66b", "nodes=1", "gpus_per_node=8", "cluster.gpu_mem_gb=80"]


def test_opt66b_zero2_on_one_node_refuses_and_names_the_setting_that_fits(workdir):
    done = run_cli(BIG + ["deepspeed=zero2"], cwd=workdir)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "does not fit" in lines[0] and "GiB" in lines[0], lines
    assert not (workdir / "runs").exists()
    fix = re.search(r"fits with (.+?) \(\d", lines[0])[1].split()

    accepted = run_cli(BIG + fix + ["dry_run=true"], cwd=workdir)
    assert accepted.returncode == 0, accepted.stderr
    assert "plan: fits" in accepted.stdout and "does not fit" not in accepted.stdout


def test_signal_lead_below_twice_the_save_time_warns(workdir):
    import sys

    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(__import__("tests.conftest").conftest.ROOT))
    from slurmtrain.common import schema
    from slurmtrain.planning import preflight

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config", overrides=["cluster=slurm", "gpus_per_node=0", "cluster.signal_lead_s=60"]
        )
    from slurmtrain.common.events import CheckpointSaved

    assert preflight.lead_warning(cfg, [CheckpointSaved(total_seconds=10.0)]) is None
    line = preflight.lead_warning(cfg, [CheckpointSaved(total_seconds=40.0)])
    assert "cluster.signal_lead_s=60" in line and "measured" in line and ">=81" in line
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        big = compose("config", overrides=["cluster=slurm", "model=opt66b", "gpus_per_node=8"])
    line = preflight.lead_warning(big, [])  # before any save: estimated from the checkpoint size
    assert line is not None and "estimated" in line


def test_the_plan_uses_the_buckets_the_run_trains_with(workdir):
    import sys

    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(__import__("tests.conftest").conftest.ROOT))
    from slurmtrain.common import ds_config
    from slurmtrain.common import schema as schema
    from slurmtrain.planning import preflight

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=opt1.3b",
                "gpus_per_node=8",
                "+deepspeed.extra.zero_optimization.reduce_bucket_size=2e8",
                "+deepspeed.extra.zero_optimization.overlap_comm=false",
            ],
        )
    assert ds_config.zero_section(cfg)["reduce_bucket_size"] == 2e8  # what DeepSpeed gets
    assert preflight.memory_plan(cfg, 1).buffers == 2 * 2 * 10**8  # bf16, one whole bucket
