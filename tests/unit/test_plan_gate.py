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
