"""Slurm backend: validate against the cluster, write job.sbatch, submit through submitit, return.

Single runs and sweeps (one job array) go through submitit's SlurmExecutor; the job.sbatch written
into every run directory is rendered from the same flags (submit/flags.py) for hand resubmission.
"""

from __future__ import annotations

import functools
from importlib.resources import files
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from omegaconf import DictConfig

from slurmtrain.common import slurm_cmd
from slurmtrain.common import slurm_text as slurm
from slurmtrain.common.schema import node_range
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.errors import EXIT_REQUEUE
from slurmtrain.common.rundir import RunDir
from slurmtrain.login.submit import Submission, TrainTask
from slurmtrain.login import flags

TEMPLATES = "slurmtrain.sbatch_templates"  # the repository's sbatch_templates/ (pyproject.toml)



def teardown(target: list[str]) -> list[str]:
    """Batch-shell lines after srun: the supervisor decides what the exit means (slurmtrain.batch.supervise).
    Where the host has no slurmtrain (container-only sites) the shell still requeues on the
    dedicated exit code."""
    py = shlex.quote(sys.executable)
    args = flags.quote_all(target)
    return ["rc=$?",
            f"if {py} -c 'import slurmtrain.batch.supervise' 2>/dev/null; then",
            f'    {py} -m slurmtrain.batch.supervise {args} --rc "$rc"; rc=$?',
            f'elif [ "$rc" -eq {EXIT_REQUEUE} ]; then',
            '    scontrol requeue "$SLURM_JOB_ID"; rc=0',
            "fi",
            'exit "$rc"']


@functools.lru_cache(maxsize=1)
def _partitions() -> dict:
    return slurm_cmd.query_partitions()  # once per process: a sweep checks every point


def check_cluster(cfg: DictConfig) -> None:
    """Refuse, before anything is queued, what this cluster's partitions cannot run."""
    try:
        partitions = _partitions()
    except slurm.SlurmError as err:
        raise ConfigError(f"cluster.kind=slurm: cannot reach Slurm ({err}); run on a login node "
                          f"or use cluster=local") from None
    errors = slurm.validate_request(cfg.cluster.partition, node_range(cfg.nodes)[1],
                                    cfg.cluster.time, cfg.gpus_per_node, partitions,
                                    keys={"nodes": "nodes", "gpus_per_node": "gpus_per_node"})
    if errors:
        raise ConfigError(errors[0])


def job_name(cfg: DictConfig) -> str:
    return f"st-{cfg.name}"


def render_sbatch(cfg: DictConfig, run: RunDir) -> str:
    env = Environment(loader=FileSystemLoader(str(files(TEMPLATES))), undefined=StrictUndefined,
                      keep_trailing_newline=True)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    logs = flags._checked("runs_root", str(run.logs))
    srun = ["--unbuffered", "--open-mode=append", f"--output={logs}/%j_%t.out",
            f"--error={logs}/%j_%t.err", *flags.srun_args(cfg)]
    return env.get_template("job.sbatch.j2").render(
        run_dir=str(run.path), sbatch_path=str(run.sbatch), container=cfg.cluster.container,
        sbatch_lines=flags.sbatch_lines(flags.sbatch_options(cfg, job_name(cfg))),
        batch_log=f"{logs}/%j.batch.out", env=flags.job_env(cfg), setup=[],
        srun_args=flags.quote_all(srun), python=flags.quote_all(flags.python_command(cfg)),
        teardown=teardown([str(run.path)]))


def executor(cfg: DictConfig, folder: Path, target: list[str], parallelism: int = 0,
             after: Optional[str] = None):
    """submitit's SlurmExecutor with the same flags, environment and supervisor as job.sbatch.

    `after`: a job id this one waits for (afterok). Submission only: job.sbatch never carries it,
    so a hand resubmission does not wait for a job long gone."""
    import submitit

    python = flags.quote_all(flags.python_command(cfg))
    ex = submitit.SlurmExecutor(folder=str(folder), python=python, max_num_timeout=10**6)
    options = flags.sbatch_options(cfg, job_name(cfg))
    if after:
        # Slurm cancels a job whose dependency can never be met (the smoke failed) instead of
        # leaving it PENDING with Reason=DependencyNeverSatisfied; down a chain too.
        options.update({"dependency": f"afterok:{flags._checked('dependency', after)}",
                        "kill-on-invalid-dep": "yes"})
    exports = [f"export {k}={shlex.quote(v)}" for k, v in flags.job_env(cfg).items()]
    ex.update_parameters(
        additional_parameters={k.replace("-", "_"): v for k, v in options.items()},
        signal_delay_s=int(cfg.cluster.signal_lead_s), srun_args=flags.srun_args(cfg),
        setup=exports, teardown=teardown(target), array_parallelism=parallelism or 256)
    return ex


def prepare(cfg: DictConfig, run: RunDir) -> None:
    """Everything before queueing: cluster check (cached) and the hand-resubmittable job.sbatch."""
    check_cluster(cfg)
    run.sbatch.write_text(render_sbatch(cfg, run))


def submit(cfg: DictConfig, run: RunDir, after: Optional[str] = None,
           **ledger: Any) -> Submission:
    """Queue the run (after job `after` succeeds, if given); `ledger` goes into `submitted`."""
    prepare(cfg, run)
    job = executor(cfg, run.logs / "submitit", [str(run.path)], after=after).submit(
        TrainTask(str(run.path)))
    run.record("submitted", job_id=job.job_id, executor="slurm", fingerprint=run.path.name,
               **({"after": after} if after else {}), **ledger)
    waits = f" (after job {after} succeeds)" if after else ""
    print(f"slurmtrain: submitted job {job.job_id} for {run.path}{waits}")
    return Submission(job.job_id, "slurm")


def submit_array(items: Sequence[tuple[DictConfig, RunDir]], folder: Path) -> list[Submission]:
    """One `sbatch --array` for every sweep point (they must share their Slurm flags)."""
    if not items:
        return []
    first = items[0][0]
    base = flags.sbatch_options(first, job_name(first))
    for cfg, run in items:
        if flags.sbatch_options(cfg, job_name(first)) != base:
            raise ConfigError(f"sweep point {run.path.name}: its Slurm flags differ from the first "
                              f"point's; sweep cluster.*/nodes in separate submissions")
        prepare(cfg, run)
    # Array tasks share one script: the supervisor finds its run by SLURM_ARRAY_TASK_ID in this map.
    folder.mkdir(parents=True, exist_ok=True)
    mapping = folder / f"sweep-{int(time.time() * 1000)}.json"
    mapping.write_text(json.dumps([str(run.path) for _, run in items]))
    ex = executor(first, folder, ["--map", str(mapping)],
                  parallelism=first.cluster.array_parallelism)
    with ex.batch():
        jobs = [ex.submit(TrainTask(str(run.path))) for _, run in items]
    out = []
    for job, (_, run) in zip(jobs, items):
        run.record("submitted", job_id=job.job_id, executor="slurm", fingerprint=run.path.name)
        out.append(Submission(job.job_id, "slurm"))
    return out
