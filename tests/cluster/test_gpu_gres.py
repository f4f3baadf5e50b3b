"""GPUs as Slurm reports them (partition `gpu`: count-only GRES gpu:8, tools/slurm_cluster.py), and
cluster=auto choosing Slurm on a machine where the controller answers."""

from __future__ import annotations

import re

import pytest

from slurmtrain.common.events import Finished
from tests.cluster.helpers import only_run, wait_event
from tests.conftest import dry_run_file, run_cli

pytestmark = pytest.mark.slurm
DETECT = {"SLURMTRAIN_AUTO": ""}  # the test session turns detection off (tests/conftest.py)


def _sbatch(stdout: str) -> dict[str, str]:
    return {m[1]: m[2] or "" for m in re.finditer(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", stdout, re.M)}


def test_gpu_partition_plans_8_gpus_per_node_in_bf16_with_the_recipe(slurm_cluster, workdir):
    gpu = slurm_cluster.gpu_partitions["gpu"]
    assert gpu.gpus_per_node == 8 and gpu.total_nodes == 2
    done = run_cli(
        ["model=opt13b", "nodes=2", "cluster=slurm", "cluster.partition=gpu", "dry_run=true"],
        cwd=workdir,
        env=DETECT,
    )
    out = done.stdout
    flat = " ".join(out.split())  # the plan's lines wrap at 120 columns
    config, script = dry_run_file(out).read_text(), dry_run_file(out, "script").read_text()
    assert "gpus_per_node=8 (partition gpu's GRES)" in done.stderr, done.stderr[:2000]
    assert "plan: opt13b" in out and "bf16" in out and "2 nodes x 8 GPUs = 16 ranks" in out
    # count-only GRES (gpu:8) names no card: gpu_type stays auto, an H100 assumed and said so
    assert "cluster.gpu_type=" not in done.stderr
    assert "79.1 GiB (H100-SXM 80GB as PyTorch reports it; cluster.gpu_type=auto" in flat
    assert "global batch 2048" in out  # 4M tokens / 2048 (the OPT-13B recipe)
    assert re.search(r"^  lr: 0\.0001$", config, re.M)
    assert re.search(r"^  seq_len: 2048$", config, re.M)
    flags = _sbatch(script)
    assert flags["gpus-per-node"] == "8" and flags["ntasks-per-node"] == "8"
    assert flags["cpus-per-task"] == "2"  # 16 CPUs / 8 GPUs per node
    assert flags["mem"] == "0" and "mem-per-gpu" not in flags  # whole GPU nodes: all their memory
    srun = next(line.strip() for line in script.splitlines() if line.strip().startswith("srun "))
    assert "--cpus-per-task=2" in srun and "--cpu-bind=cores" in srun
    assert "--distribution=block:block" in srun  # ranks of one socket's GPUs on that socket
    # The plan either fits (exit 0) or says why (exit 2, as the real command would be refused).
    assert "Slurm says:" in out or "--test-only gave no answer" in out
    assert done.returncode == 0 or (done.returncode == 2 and "does not fit" in done.stderr)


def test_a_fitting_gpu_plan_gets_slurms_answer(slurm_cluster, workdir):
    done = run_cli(
        ["model=opt125m", "nodes=2", "cluster=slurm", "cluster.partition=gpu", "dry_run=true"],
        cwd=workdir,
        env=DETECT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    flat = " ".join(done.stdout.split())  # a line over 120 columns wraps
    assert re.search(r"Slurm says: .*to start at .* on nodes n\[5-6\] in partition gpu", flat)


def test_too_many_gpu_nodes_is_refused_by_the_dry_run_too(slurm_cluster, workdir):
    done = run_cli(
        ["model=opt125m", "nodes=4", "cluster=slurm", "cluster.partition=gpu", "dry_run=true"],
        cwd=workdir,
        env=DETECT,
    )
    assert done.returncode == 2 and "exceed partition 'gpu'" in done.stderr


def test_no_cluster_key_submits_to_slurm_when_it_answers(slurm_cluster, workdir):
    done = run_cli(
        [
            "model=opt_tiny",
            "nodes=2",
            "train.max_steps=10",
            "train.log_interval=5",
            "checkpoint.interval_steps=0",
            "name=auto",
        ],
        cwd=workdir,
        env=DETECT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "slurmtrain: auto: cluster=slurm (the Slurm controller answers)" in done.stderr
    assert "submitted job" in done.stdout
    wait_event(only_run(workdir / "runs", "auto"), Finished, timeout=400)
