"""Refused means exit 2 (issue 35, build 7): a dry run that the real local Slurm refuses
(`sbatch --test-only`), or that the real submission refuses (nodes beyond the cluster, local or
Slurm), exits 2 with one line in Slurm's own words; what Slurm takes still exits 0."""

from __future__ import annotations

import pytest

from tests.conftest import dry_run_file, run_cli

pytestmark = pytest.mark.slurm
CASES = [
    (["cluster=slurm", "cluster.constraint=a100"], "Invalid feature specification"),
    (["cluster=slurm", "cluster.mem=100000G"], "sbatch --test-only"),
    (["cluster=slurm", "nodes=64"], "64 nodes exceed partition 'debug'"),
    (["cluster=local", "nodes=64"], "nodes=64: the local executor runs on this machine only"),
]


@pytest.mark.parametrize("args,words", CASES, ids=[c[0][-1] for c in CASES])
def test_refused_dry_runs_exit_2_in_one_line(slurm_cluster, workdir, args, words):
    done = run_cli([*args, "dry_run=true"], cwd=workdir)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("slurmtrain: error:")]
    assert len(errors) == 1 and words in errors[0], done.stderr
    assert "plan:" in done.stdout  # shown first: what force=true would queue
    assert not (workdir / "runs").exists()


def test_what_slurm_takes_exits_0(slurm_cluster, workdir):
    done = run_cli(
        ["cluster=slurm", "+cluster.sbatch_extra.mem_per_cpu=100M", "dry_run=true"], workdir
    )
    assert done.returncode == 0, done.stderr
    assert "Slurm says: sbatch: Job" in done.stdout
    assert "#SBATCH --mem-per-cpu=100M" in dry_run_file(done.stdout, "script").read_text()


def test_auto_off_beside_an_explicit_slurm_keeps_the_partitions_gpus(slurm_cluster, workdir):
    """SLURMTRAIN_AUTO=off picks this machine and CPU ranks for cluster=auto; beside an explicit
    cluster=slurm it no longer forces gpus_per_node=0 on a GPU partition (issue 35)."""
    off = {"SLURMTRAIN_AUTO": "off"}
    gpu = run_cli(["cluster=slurm", "cluster.partition=gpu", "dry_run=true"], workdir, off)
    assert "gpus_per_node=8 (partition gpu's GRES)" in gpu.stderr, gpu.stderr
    assert "#SBATCH --gpus-per-node=8" in dry_run_file(gpu.stdout, "script").read_text()
    local = run_cli(["dry_run=true"], workdir, off)  # cluster=auto: this machine, CPU ranks
    assert local.returncode == 0 and "gpus_per_node=0 (SLURMTRAIN_AUTO=off)" in local.stderr
