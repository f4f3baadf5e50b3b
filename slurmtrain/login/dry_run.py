"""`dry_run=true`: show everything a submission would do, queue nothing, and exit as it would.

Why an exit code: scripts gate on `python -m slurmtrain ... dry_run=true` before a real submission,
so a dry run of a command that would be refused (plan does not fit, bad partition, too many nodes)
exits 2 with the same one-line reason, after printing the plan. With Slurm it also renders the exact
batch script (slurm_submit.render_sbatch, the one submission writes) and prints Slurm's own answer to
it (`sbatch --test-only`: expected start and nodes), so what is shown is what would be queued.

Output that fits: the plan comes first, every line within 120 columns (the error line on stderr
stays one line, for scripts that read it); the full config (secrets as references) and batch script
are written to files whose paths are printed (details_folder; Hydra's `--cfg job` prints the config
too). A sweep prints one line per point and a summary (sweep).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, TextIO

from omegaconf import DictConfig

from slurmtrain.common import ownership, rundir, secrets, validation
from slurmtrain.common.commands import run_cmd
from slurmtrain.common.errors import EXIT_CONFIG, ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.secrets import redact_overrides
from slurmtrain.common.slurm_text import SlurmError
from slurmtrain.login import flags, placement
from slurmtrain.login.cluster_check import check_cluster
from slurmtrain.login.composed import typed
from slurmtrain.login.placement import announce
from slurmtrain.login.slurm_submit import render_sbatch
from slurmtrain.planning import preflight
from slurmtrain.planning.preflight import WIDTH, fit

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


def _not_ours(cfg: DictConfig) -> Optional[str]:
    """An existing run directory another user made or can swap: refused as a submission would."""
    run = rundir.locate(cfg, secrets.referenced(cfg))
    try:
        ownership.check_existing(run.path, run.mode)
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


@dataclass
class Examined:
    """One point's dry run: its plan, refusal, Slurm's verdict and where the details were written."""

    typed: RootConfig
    report: preflight.PlanReport
    refused: Optional[str] = None
    notes: list[str] = field(default_factory=list)  # lines printed before the plan
    after: list[str] = field(default_factory=list)  # lines printed after it (script, verdict)
    folder: Optional[Path] = None


def details_folder(cfg: DictConfig, point: str = "") -> Path:
    """Where a dry run leaves the full config and batch script: the system's temporary folder,
    by user, run name and fingerprint, and a sweep's point (points may share a fingerprint:
    placement keys are not in it); the run directory itself is never written by a dry run."""
    fingerprint = rundir.locate(cfg, secrets.referenced(cfg)).path.name
    root = Path(tempfile.gettempdir()) / f"slurmtrain-dry-run-{os.getuid()}"
    ownership.private_dir(root)  # a predictable /tmp path: refused if another user made it first
    ownership.tighten_umask(ownership.dir_mode(cfg.get("run_dir_mode")))  # files as a run's
    folder = root / str(cfg.name) / fingerprint / point
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def examine(cfg: DictConfig, point: str = "") -> Examined:
    """Plan, refusal and (Slurm) batch script and `sbatch --test-only` of one point; the full
    config, plan and script go to files in details_folder, nothing is printed."""
    typed_cfg = typed(cfg)
    planned_time = typed_cfg.cluster.time
    found = Examined(typed_cfg, preflight.report(typed_cfg))
    found.refused = refusal(typed_cfg, found.report)
    if typed_cfg.cluster.time != planned_time:  # cluster.time=auto planned from the partition
        found.notes.append(
            f"slurmtrain: cluster.time={typed_cfg.cluster.time} ({typed_cfg.cluster.time_from})"
        )
        found.report = preflight.report(typed_cfg)
    executor = placement.plan_line(typed_cfg)  # cluster=auto chose this machine: why
    found.notes += [executor] if executor else []
    note = flags.port_note(typed_cfg)
    found.after += [note] if note else []
    found.refused = found.refused or _not_ours(cfg)
    found.folder = folder = details_folder(cfg, point)
    (folder / "config.yaml").write_text(secrets.redacted_yaml(cfg) + "\n")  # secrets: references
    (folder / "plan.txt").write_text(found.report.text + "\n")
    found.after.append(f"slurmtrain: dry run: full config (or --cfg job): {folder / 'config.yaml'}")
    if typed_cfg.cluster.kind == "slurm":  # shown even when refused: what force=true would queue
        _slurm(cfg, found)
    refused = [f"slurmtrain: error: {found.refused}"] if found.refused else []
    lines = [*found.notes, found.report.text, *found.after, *refused]
    (folder / "dry_run.txt").write_text("\n".join(lines) + "\n")  # all of it, unwrapped
    return found


def _slurm(cfg: DictConfig, found: Examined) -> None:
    """The batch script (written beside the config) and Slurm's answer to it."""
    assert found.folder is not None
    script = render_sbatch(found.typed, rundir.locate(cfg, secrets.referenced(cfg)))
    (found.folder / "job.sbatch").write_text(script)
    found.after.append(f"slurmtrain: dry run: batch script: {found.folder / 'job.sbatch'}")
    dependency = flags.user_dependency(found.typed)
    if dependency:
        found.after.append(
            f"slurmtrain: dry run: the first submission also waits: --dependency={dependency} "
            f"(cluster.sbatch_extra; never in job.sbatch)"
        )
    try:
        answer = test_only(script)
        lines = [
            ln for ln in answer.splitlines() if re.search(r"to start at", ln)
        ] or answer.splitlines()[-1:]
        found.after.append(f"slurmtrain: dry run: Slurm says: {' '.join(lines)}")
    except SlurmError as err:
        # Slurm's own words; the real sbatch would be refused the same way (exit 2).
        found.after.append(f"slurmtrain: dry run: sbatch --test-only refused the job ({err})")
        found.refused = (
            found.refused or f"cluster: Slurm refuses this job: sbatch --test-only: {err}"
        )


def show(cfg: DictConfig, out: Optional[TextIO] = None) -> int:
    """Print the plan, then where the full config and batch script are and (Slurm) Slurm's
    answer, every line within WIDTH columns; 0 or EXIT_CONFIG."""
    out = out or sys.stdout
    announce()
    found = examine(cfg)
    print(fit("\n".join([*found.notes, found.report.text, *found.after])), file=out)
    if found.refused:
        line = f"slurmtrain: error: {placement.with_why(found.refused, found.typed)}"
        print(line, file=sys.stderr)  # one line, never wrapped: scripts grep it
        print(
            "slurmtrain: dry run: the same command without dry_run=true would be refused (exit 2)",
            file=out,
        )
        return EXIT_CONFIG
    return 0


def _varying(points: Sequence[tuple[DictConfig, list[str]]]) -> list[list[str]]:
    """Each point's overrides less those every point shares (the sweep's axes)."""
    lists = [redact_overrides(list(o)) for _, o in points]
    shared = set.intersection(*(set(o) for o in lists)) if len(lists) > 1 else set()
    return [[o for o in each if o not in shared] for each in lists]


def point_line(index: int, total: int, axes: list[str], found: Examined) -> str:
    """`point 2/3 refused  lr=3e-4: 64 nodes x 8 GPUs = 512 ranks; <why>`, cut to WIDTH."""
    verdict = "refused" if found.refused else "ok     "
    line = (
        f"point {index}/{total} {verdict} {' '.join(axes) or '(no overrides)'}: "
        f"{preflight.placement_text(found.typed)}" + (f"; {found.refused}" if found.refused else "")
    )
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def sweep(points: Sequence[tuple[DictConfig, list[str]]], out: Optional[TextIO] = None) -> int:
    """A sweep's dry run: one line per point, then a summary; EXIT_CONFIG when any point would be
    refused. Each point's full output, config and script: its details_folder."""
    out = out or sys.stdout
    announce()
    refused: list[tuple[int, str]] = []  # (point, why)
    folders: list[str] = []
    for index, ((cfg, _), axes) in enumerate(zip(points, _varying(points)), 1):
        found = examine(cfg, f"point-{index}")
        folders.append(str(found.folder))
        if found.refused:
            refused.append((index, found.refused))
        print(point_line(index, len(points), axes, found), file=out)
    where = os.path.commonpath(folders) if folders else "-"
    slurm = any(cfg.cluster.kind == "slurm" for cfg, _ in points)
    print(
        fit(
            f"slurmtrain: dry run: {len(points)} sweep points, {len(points) - len(refused)} ok, "
            f"{len(refused)} refused; each point's full output and config (dry_run.txt, "
            f"config.yaml{', job.sbatch' if slurm else ''}) under {where}"
        ),
        file=out,
    )
    if refused:
        print(  # one line: the reasons are the point lines', in full in each dry_run.txt
            f"slurmtrain: error: {len(refused)} of {len(points)} sweep points would be refused "
            f"(point {refused[0][0]} first); each point's dry_run.txt says why",
            file=sys.stderr,
        )
        print(
            "slurmtrain: dry run: the same command without dry_run=true would be refused (exit 2)",
            file=out,
        )
        return EXIT_CONFIG
    return 0
