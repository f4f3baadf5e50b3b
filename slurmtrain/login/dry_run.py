"""`dry_run=true`: show everything a submission would do, queue nothing, and exit as it would.

Why an exit code: scripts gate on `python -m slurmtrain ... dry_run=true` before a real submission,
so a dry run of a command that would be refused (plan does not fit, bad partition, too many nodes)
exits 2 with the same one-line reason, after printing the plan. With Slurm it also prints the exact
batch script (slurm_submit.render_sbatch, the one submission writes) and Slurm's own answer to it
(`sbatch --test-only`: expected start and nodes), so what is shown is what would be queued.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Optional, TextIO

from omegaconf import DictConfig

from slurmtrain.common import rundir, secrets, validation
from slurmtrain.common.commands import run_cmd
from slurmtrain.common.errors import EXIT_CONFIG, ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.slurm_text import SlurmError
from slurmtrain.login import flags, placement
from slurmtrain.login.cluster_check import check_cluster
from slurmtrain.login.composed import typed
from slurmtrain.login.placement import announce
from slurmtrain.login.slurm_submit import render_sbatch
from slurmtrain.planning import preflight

TEST_ONLY_TIMEOUT_S = 20.0


def refusal(cfg: RootConfig, report: preflight.PlanReport) -> Optional[str]:
    """The line a real submission would refuse with, or None: the plan gate, the checks only a
    submission makes (nodes=64 on the local executor, smoke or spares off Slurm), then the
    cluster's partitions (Slurm)."""
    try:
        report.enforce(cfg)
        validation.validate_config(cfg, submitting=True)
        if cfg.cluster.kind == "slurm":
            check_cluster(cfg)
    except ConfigError as err:
        return str(err)
    return None


def test_only(script: str) -> str:
    """Slurm's answer to the script without queueing it: `sbatch --test-only` (it prints
    "Job N to start at T using C processors on nodes H in partition P" on stderr)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as f:
        f.write(script)
    try:
        cmd = run_cmd(["sbatch", "--test-only", f.name], TEST_ONLY_TIMEOUT_S)
        if not cmd.ok:
            raise SlurmError(cmd.reason())
        return (cmd.err + cmd.out).strip()
    finally:
        os.unlink(f.name)


def show(cfg: DictConfig, out: Optional[TextIO] = None) -> int:
    """Print config, plan, and on Slurm the batch script and Slurm's answer; 0 or EXIT_CONFIG."""
    out = out or sys.stdout
    announce()
    print(secrets.redacted_yaml(cfg), file=out)  # secrets as references, never values
    typed_cfg = typed(cfg)
    report = preflight.report(typed_cfg)
    planned_time = typed_cfg.cluster.time
    refused = refusal(typed_cfg, report)
    if typed_cfg.cluster.time != planned_time:  # cluster.time=auto planned from the partition
        print(
            f"slurmtrain: cluster.time={typed_cfg.cluster.time} ({typed_cfg.cluster.time_from})",
            file=out,
        )
        report = preflight.report(typed_cfg)
    executor = placement.plan_line(typed_cfg)  # cluster=auto chose this machine: why
    print(report.text if executor is None else f"{executor}\n{report.text}", file=out)
    note = flags.port_note(typed_cfg)
    if note:
        print(note, file=out)
    if typed_cfg.cluster.kind == "slurm":  # shown even when refused: what force=true would queue
        script = render_sbatch(typed_cfg, rundir.locate(cfg, secrets.referenced(cfg)))
        print("slurmtrain: dry run: the batch script that would be submitted:", file=out)
        print(script.rstrip("\n"), file=out)
        dependency = flags.user_dependency(typed_cfg)
        if dependency:
            print(
                f"slurmtrain: dry run: the first submission also waits: --dependency={dependency} "
                f"(cluster.sbatch_extra; never in job.sbatch)",
                file=out,
            )
        try:
            answer = test_only(script)
            lines = [
                ln for ln in answer.splitlines() if re.search(r"to start at", ln)
            ] or answer.splitlines()[-1:]
            print(f"slurmtrain: dry run: Slurm says: {' '.join(lines)}", file=out)
        except SlurmError as err:
            # Slurm's own words; the real sbatch would be refused the same way (exit 2).
            print(f"slurmtrain: dry run: sbatch --test-only refused the job ({err})", file=out)
            refused = refused or f"cluster: Slurm refuses this job: sbatch --test-only: {err}"
    if refused:
        print(f"slurmtrain: error: {placement.with_why(refused, typed_cfg)}", file=sys.stderr)
        print(
            "slurmtrain: dry run: the same command without dry_run=true would be refused (exit 2)",
            file=out,
        )
        return EXIT_CONFIG
    return 0
