"""Slurm resources of the headline run: cores, memory and binding per task on a 64 x 8
GPU partition, and CPU plans of big models refused. Partitions are PartitionInfo objects parsed
from `scontrol show partition` text; nothing of Slurm runs or is mocked."""

from __future__ import annotations

import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.common.slurm_text import parse_partitions
from slurmtrain.login import cluster_check, flags, placement, slurm_submit
from slurmtrain.planning.shapes import param_count

schema.register()

# 64 nodes of 8 GPUs, 2 sockets x 56 cores, 2 TB each.
GPU64 = (
    "PartitionName=gpu Default=NO MaxNodes=UNLIMITED MaxTime=2-00:00:00 Nodes=g[001-064] "
    "State=UP TotalCPUs=7168 TotalNodes=64 TRES=cpu=7168,mem=128000G,node=64,billing=7168,"
    "gres/gpu=512\n"
)
CPU_DEFAULT = (
    "PartitionName=cpu Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=c[1-8] "
    "State=UP TotalCPUs=512 TotalNodes=8 TRES=cpu=512,mem=2000G,node=8,billing=512\n"
)


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["cluster=slurm", f"runs_root={tmp_path}", "checkpoint.interval_steps=25"]
            + ["cluster.time=04:00:00"]  # what validation resolves `auto` to before this check
            + list(overrides),
        )
    return cfg


def _headline(tmp_path, part_text=GPU64, *more):
    part = parse_partitions(part_text)["gpu"]
    cfg = _cfg(
        tmp_path, "model=opt13b", "nodes=64", "gpus_per_node=8", "cluster.partition=gpu", *more
    )
    placement.slurm_defaults(cfg, part)
    return cfg


def _script_flags(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        m = re.match(r"#SBATCH --([\w-]+)(?:=(.*))?$", line)
        if m:
            out[m[1]] = shlex.split(m[2])[0] if m[2] else True
    return out


def test_headline_asks_every_core_and_all_memory_of_its_nodes(tmp_path):
    cfg = _headline(tmp_path)
    opts = flags.sbatch_options(cfg, "x")
    assert opts["nodes"] == "64" and opts["ntasks-per-node"] == "8"
    assert opts["gpus-per-node"] == "8"
    assert opts["cpus-per-task"] == "14"  # 112 cores / 8 tasks
    assert opts["mem"] == "0" and "mem-per-gpu" not in opts  # the whole node's memory


def test_headline_srun_binds_cores_block_wise_on_one_socket(tmp_path):
    srun = flags.srun_args(_headline(tmp_path))
    assert "--cpus-per-task=14" in srun  # srun 22.05-23.02 does not inherit it
    assert "--cpu-bind=cores" in srun and "--distribution=block:block" in srun


def test_a_distribution_of_the_users_wins(tmp_path):
    cfg = _headline(tmp_path, GPU64, "cluster.srun_extra=['--distribution=block:cyclic']")
    srun = flags.srun_args(cfg)
    assert "--distribution=block:block" not in srun and "--distribution=block:cyclic" in srun


def test_the_dry_run_script_shows_cpus_and_memory_per_task(tmp_path):
    cfg = _headline(tmp_path)
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    line = next(ln for ln in script.splitlines() if ln.startswith("# Per task:"))
    assert "14 CPUs" in line and "all of each node's memory (--mem=0)" in line
    assert "8 tasks" in line and "block:block" in line
    got = _script_flags(script)
    assert got["cpus-per-task"] == "14" and got["mem"] == "0"


def test_a_partition_capping_node_memory_gets_memory_per_gpu(tmp_path):
    capped = GPU64.replace("State=UP", "MaxMemPerNode=1500000 State=UP")
    assert parse_partitions(capped)["gpu"].max_mem_per_node_mb == 1500000
    cfg = _headline(tmp_path, capped)
    opts = flags.sbatch_options(cfg, "x")
    assert "mem" not in opts and opts["mem-per-gpu"] == f"{1500000 // 8}M"


def test_half_a_node_asks_its_gpus_share(tmp_path):
    part = parse_partitions(GPU64)["gpu"]
    cfg = _cfg(tmp_path, "model=opt1.3b", "nodes=1", "gpus_per_node=4", "cluster.partition=gpu")
    placement.slurm_defaults(cfg, part)
    opts = flags.sbatch_options(cfg, "x")
    assert opts["cpus-per-task"] == "14"  # 112 / 8 GPUs: the other 4 GPUs keep their cores
    assert opts["mem-per-gpu"] == f"{128000 * 1024 // 64 // 8}M" and "mem" not in opts


def test_explicit_values_win(tmp_path):
    cfg = _headline(tmp_path, GPU64, "cluster.cpus_per_task=6", "cluster.mem_per_gpu=100G")
    opts = flags.sbatch_options(cfg, "x")
    assert opts["cpus-per-task"] == "6" and opts["mem-per-gpu"] == "100G" and "mem" not in opts


def test_cpu_ranks_keep_one_core_and_the_sites_memory(tmp_path):
    part = parse_partitions(CPU_DEFAULT)["cpu"]
    cfg = _cfg(tmp_path, "model=opt_tiny", "gpus_per_node=0")
    placement.slurm_defaults(cfg, part)
    opts = flags.sbatch_options(cfg, "x")
    assert opts["cpus-per-task"] == "1" and "mem" not in opts and "mem-per-gpu" not in opts


@pytest.mark.parametrize(
    "model,insisted,refused",
    [
        ("opt13b", False, True),
        ("opt350m", False, True),
        ("opt125m", False, False),
        ("opt_tiny", False, False),
        ("opt13b", True, False),
    ],
)
def test_a_big_model_on_a_partition_without_gpus_is_refused(tmp_path, model, insisted, refused):
    part = parse_partitions(CPU_DEFAULT)["cpu"]
    cfg = _cfg(tmp_path, f"model={model}", "gpus_per_node=0")
    line = flags.cpu_plan_refusal(cfg, part, param_count(cfg.model), insisted)
    if not refused:
        assert line is None
        return
    assert line is not None and "\n" not in line
    assert line.startswith("cluster.partition=cpu: partition 'cpu' has no GPUs")
    assert "cluster.partition=" in line and "gpus_per_node=0 to insist" in line


def test_check_cluster_refuses_the_cpu_plan_of_opt13b(tmp_path, monkeypatch):
    # The cluster's answer given as parsed partitions: the default one has no GPUs.
    parts = parse_partitions(CPU_DEFAULT + GPU64)
    monkeypatch.setattr(cluster_check, "partitions", lambda: parts)
    cfg = _cfg(tmp_path, "model=opt13b", "gpus_per_node=0")
    with pytest.raises(ConfigError, match=r"partition 'cpu' has no GPUs.*to insist"):
        cluster_check.check_cluster(cfg)
    tiny = _cfg(tmp_path, "model=opt_tiny", "gpus_per_node=0")
    cluster_check.check_cluster(tiny)  # the CPU test path
    gpu = _cfg(tmp_path, "model=opt13b", "gpus_per_node=8", "cluster.partition=gpu")
    cluster_check.check_cluster(gpu)
