"""Issue 37, build 6 (the smaller items), each reproduced on the code before it, then fixed:
container images checked at login, OCI binds read-only where the job only reads, and CPU plans
whose memory is absurd refused like any plan that does not fit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurmtrain.common.errors import EXIT_CONFIG
from slurmtrain.planning import host_memory, preflight
from tests.conftest import slurmtrain_env
from tests.plans import planned


@pytest.mark.usefixtures("no_slurm")
def test_an_absurd_cpu_plan_is_refused_naming_the_key_the_value_and_the_fix(tmp_path):
    """train.micro_batch_size=100000000 planned 173 TiB per rank with exit 0 (no GPU memory to
    compare with): the local ranks run on this machine, so its RAM is the bound."""
    cfg = planned(tmp_path, "cluster=local", "gpus_per_node=0", "train.micro_batch_size=100000000")
    report = preflight.report(cfg)
    ram, source = host_memory.node_memory("local", None)
    assert ram and source == "this machine's RAM"
    assert report.misfit is not None, report.text
    assert report.misfit.startswith("plan does not fit: train.micro_batch_size=100000000: "), (
        report.misfit
    )
    assert "TiB x 2 CPU ranks" in report.misfit and "set train.micro_batch_size=" in report.misfit
    fits = int(report.misfit.split("set train.micro_batch_size=")[1].split()[0])
    small = planned(tmp_path, "cluster=local", "gpus_per_node=0", f"train.micro_batch_size={fits}")
    assert preflight.report(small).misfit is None  # the number it names does fit
    default = planned(tmp_path, "cluster=local", "gpus_per_node=0")
    assert preflight.report(default).misfit is None


@pytest.mark.usefixtures("no_slurm")
def test_cpu_mem_gb_bounds_a_cpu_plan_anywhere_and_a_model_too_big_names_no_micro_batch(tmp_path):
    big = planned(tmp_path, "cluster=local", "gpus_per_node=0", "model=opt13b",
                  "cluster.cpu_mem_gb=8")  # fmt: skip
    misfit = preflight.report(big).misfit or ""
    assert "> 8.0 GiB (cluster.cpu_mem_gb=8); use a smaller model" in misfit, misfit
    assert host_memory.node_memory("slurm", None) == (None, "")  # unknown: nothing refused


def test_the_dry_run_of_an_absurd_plan_exits_2_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "slurmtrain", "cluster=local", "gpus_per_node=0",
         "train.micro_batch_size=100000000", "dry_run=true", f"runs_root={tmp_path}"],
        capture_output=True, text=True, env=slurmtrain_env(), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("slurmtrain: error:")]
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert len(errors) == 1 and "train.micro_batch_size=100000000" in errors[0], done.stderr
