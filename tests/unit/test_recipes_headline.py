"""Every shipped OPT recipe dry-runs at its headline scale on a GPU partition: the batch divides
over the GPUs, the memory plan fits 80 GB, the partition takes the job (dry_run.refusal: what a
real submission would refuse). The partition is `scontrol show partition` text parsed as
PartitionInfo (a parsing fake); nothing of Slurm runs."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.rundir import locate
from slurmtrain.common.slurm_text import parse_partitions
from slurmtrain.login import cluster_check, dry_run, placement, slurm_submit
from slurmtrain.login.prepare import resolve
from slurmtrain.planning import preflight

schema.register()

# 64 nodes of 8 GPUs (80 GB), 112 cores and 2 TB each.
GPU64 = (
    "PartitionName=gpu Default=YES MaxNodes=UNLIMITED MaxTime=2-00:00:00 Nodes=g[001-064] "
    "State=UP TotalCPUs=7168 TotalNodes=64 TRES=cpu=7168,mem=128000G,node=64,billing=7168,"
    "gres/gpu=512\n"
)

# (recipe, nodes of 8 GPUs, what the user adds). The headline is 64 x 8 where the recipe's global
# batch has sequences for 512 GPUs at its micro batch; the OPT batches of the small sizes (256,
# 512, 1024 sequences at micro batch 4) fill 8, 16 and 32 nodes. ZeRO-3 is the user's choice
# (a recipe cannot pick a deepspeed group: Hydra forbids it under `recipe: ${model}`); the plan's
# refusal names it.
HEADLINE = [
    ("opt125m", 8, ()),
    ("opt350m", 8, ()),
    ("opt1.3b", 16, ()),
    ("opt2.7b", 16, ()),
    ("opt6.7b", 32, ()),
    ("opt13b", 64, ()),
    ("opt30b", 64, ("deepspeed=zero3", "train.micro_batch_size=2")),
    ("opt66b", 64, ("deepspeed=zero3",)),
]


@pytest.fixture(autouse=True)
def _gpu_partition(monkeypatch):
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")
    placement._probe_cache.clear()
    monkeypatch.setattr(cluster_check, "partitions", lambda: parse_partitions(GPU64))
    yield
    placement._probe_cache.clear()


def _dry_run(tmp_path, model: str, nodes: int, *extra: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"runs_root={tmp_path}",
                f"model={model}",
                f"nodes={nodes}",
                "gpus_per_node=8",
                "cluster=slurm",
                "dry_run=true",
                *extra,
            ],
        )
    return resolve(cfg)


@pytest.mark.parametrize("model,nodes,extra", HEADLINE)
def test_each_recipe_dry_runs_at_its_headline_scale(tmp_path, model, nodes, extra):
    cfg = _dry_run(tmp_path, model, nodes, *extra)
    report = preflight.report(cfg)
    assert dry_run.refusal(cfg, report) is None, report.text
    assert "plan: fits" in report.text
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    assert f"#SBATCH --nodes={nodes}" in script and "#SBATCH --gpus-per-node=8" in script


def test_opt66b_at_64x8_is_refused_only_for_memory_naming_zero3(tmp_path):
    # The headline command: the batch divides (1024 = micro 1 x accumulation 2 x 512 GPUs); the
    # plan's one line names the fix, ZeRO-3.
    cfg = _dry_run(tmp_path, "opt66b", 64)
    assert cfg.train.micro_batch_size * 512 * 2 == cfg.train.global_batch_size == 1024
    refused = dry_run.refusal(cfg, preflight.report(cfg))
    assert refused and "plan does not fit" in refused and "fits with deepspeed=zero3 " in refused
