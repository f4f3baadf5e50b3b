"""Slurm backend: validate against the cluster, write job.sbatch, submit through submitit, return.

Single runs, smoke chains and sweeps (one job array) are queued by submitit's SlurmExecutor with
slurmtrain's own batch script (`render_script`, flags from login/flags.py), the very script written
to RUN_DIR/job.sbatch: every restart and a hand resubmission run what the first attempt ran.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shlex
import time
import uuid
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template

from slurmtrain.batch import successor
from slurmtrain.common import secrets, slurm_cmd
from slurmtrain.common.derived import derived_of
from slurmtrain.common.durable import in_parallel, persist
from slurmtrain.common.errors import EXIT_RELAUNCH, EXIT_REQUEUE, ConfigError
from slurmtrain.common.events import Submitted, Where
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.schema_cluster import setup_lines
from slurmtrain.login import container, flags, stage_env
from slurmtrain.login.cluster_check import check_cluster
from slurmtrain.login.submission import Submission

if TYPE_CHECKING:
    from submitit import SlurmExecutor


TEMPLATES = "slurmtrain.sbatch_templates"  # the repository's sbatch_templates/ (pyproject.toml)


def job_name(cfg: RootConfig, run_dir: str | Path | None = None) -> str:
    """A single run's jobs carry a name of its own when a successor waits on it (singleton:
    batch/successor.py); an array's, the plain one."""
    if run_dir and cfg.faults.successor:
        return successor.job_name(cfg.name, run_dir)
    return f"st-{cfg.name}"


def run_tag(run_dir: str | Path) -> str:
    """The comment every job of one run carries (`#SBATCH --comment=` in job.sbatch, so a hand
    `sbatch job.sbatch` carries it too): `cli cancel` finds all of a run's jobs in one squeue.
    NAME/FINGERPRINT for people reading squeue, a hash of the full path so that two runs roots
    holding the same config never share a tag."""
    path = Path(run_dir)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return flags.checked("runs_root", f"slurmtrain:{path.parent.name}/{path.name}@{digest}")


@functools.lru_cache(maxsize=1)
def _template() -> Template:
    """Compiled once per process (a 64-point sweep renders it 65 times)."""
    env = Environment(
        loader=FileSystemLoader(str(files(TEMPLATES))),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env.get_template("job.sbatch.j2")


def render_script(
    cfg: RootConfig,
    run_dir: str,
    options: dict[str, flags.Flag],
    batch_log: str,
    array_map: Optional[str] = None,
    has_secrets: Optional[bool] = None,
) -> str:
    """The one batch script of every Slurm submission: first attempt, restart, array task, by hand.

    `run_dir` is the run directory's path; in a job array it is found at run time from
    SLURM_ARRAY_TASK_ID in `array_map` (a JSON list), and the script then appends its own output to
    that run's logs/ like a single job's. srun line, environment and supervisor are the same.
    """
    run_arg = '"$RUN_DIR"' if array_map else shlex.quote(flags.checked("runs_root", run_dir))
    logs = '"$RUN_DIR"/logs' if array_map else shlex.quote(f"{run_dir}/logs")
    srun = ["--unbuffered", "--open-mode=append", *flags.srun_args(cfg)]
    # cluster.env is configuration, exported here (flags.script_env); secrets are sourced from the
    # run's 0600 secrets.env, never written here (common/secrets.py); an array's points each have
    # their own (or none).
    env = flags.script_env(cfg)
    secrets_file = None
    if array_map:
        secrets_file = f'"$RUN_DIR"/{secrets.ENV_FILE}'
    elif has_secrets if has_secrets is not None else secrets.values(_plain_enough(cfg)):
        secrets_file = shlex.quote(f"{run_dir}/{secrets.ENV_FILE}")
    return _template().render(
        run_dir=run_dir,
        array_map=array_map,
        container=cfg.cluster.container,
        sbatch_lines=flags.sbatch_lines(options),
        # an array trains many runs: no one tag; a user's sbatch_extra.comment after the tag
        comment=flags.job_comment(cfg, None if array_map else run_tag(run_dir)),
        allow_inject=bool(cfg.faults.allow_inject),
        batch_log=batch_log,
        env=env,
        secrets_file=secrets_file,
        setup=setup_lines(cfg.cluster.setup),
        python_path=flags.host_python(cfg),
        logs=logs,
        srun_args=flags.quote_all(srun),
        container_args=flags.quote_all(flags.container_srun_args(cfg)),
        oci=cfg.cluster.container == "oci",
        oci_config=('"$RUN_DIR"' if array_map else shlex.quote(run_dir))
        + f"/{container.BUNDLE_DIR}/config.json",
        python=flags.quote_all(flags.python_command(cfg)),
        run_arg=run_arg,
        exit_requeue=EXIT_REQUEUE,
        exit_relaunch=EXIT_RELAUNCH,
        exit_not_needed=successor.EXIT_NOT_NEEDED,
        in_allocation=derived_of(cfg).in_allocation,
        spare_nodes=int(cfg.faults.spare_nodes),
        nodes=cfg.nodes,
        nodes_max=derived_of(cfg).nodes[1],
        tasks_per_node=derived_of(cfg).per_node,
        per_task=flags.per_task_text(cfg),
        trace=flags.flight_recorder(cfg),
        stage_env=stage_env.script_values(cfg),  # None unless cluster.stage_env
    )


def _plain_enough(cfg: RootConfig) -> object:
    """What secrets.values needs (keys and string values) of a DictConfig or of a checked config's
    dataclasses: dataclasses.asdict, where schema.plain would re-type it first (~20 ms a point)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    return cfg


def render_sbatch(
    cfg: RootConfig,
    run: RunDir,
    options: Optional[dict[str, flags.Flag]] = None,
    recorded: bool = False,
) -> str:
    """RUN_DIR/job.sbatch: `sbatch RUN_DIR/job.sbatch` resumes the run (no dependency, no array).
    `options`: flags.sbatch_options(cfg, job_name(cfg)) when the caller has them already.
    `recorded`: the run's files are written (prepare.record), secrets.env among them or not."""
    logs = flags.checked("runs_root", str(run.logs))
    return render_script(
        cfg,
        str(run.path),
        options if options is not None else flags.sbatch_options(cfg, job_name(cfg, run.path)),
        batch_log=f"{logs}/%j.batch.out",
        has_secrets=(run.path / secrets.ENV_FILE).exists() if recorded else None,
    )


def executor(
    cfg: RootConfig,
    folder: Path,
    target: list[str],
    parallelism: int = 0,
    after: Optional[str] = None,
    array_map: Optional[str] = None,
) -> SlurmExecutor:
    """submitit's SlurmExecutor submitting slurmtrain's own batch script (`render_script`).

    submitit keeps what it is good at: sbatch, job ids, job arrays, job objects. Its generated
    script and pickled callable are not used, so the first attempt runs exactly the srun line,
    environment and supervisor that every restart and a hand `sbatch job.sbatch` run.
    `target`: [run_dir]. `after`: a job id this one waits for (afterok); at submission only:
    job.sbatch never carries it, so a hand resubmission does not wait for a job long gone."""
    run_dir = target[0] if target else ""
    options = _first_submission_options(cfg, after, None if array_map else run_dir)
    batch_log = (
        f"{folder}/%A_%a.batch.out"
        if array_map
        else f"{flags.checked('runs_root', run_dir)}/logs/%j.batch.out"
    )

    def script(count: int) -> str:
        """The batch script; `count`: the array's size (0: one job)."""
        opts = dict(options)
        if count:
            opts["array"] = f"0-{count - 1}%{min(count, parallelism or 256)}"
        return render_script(cfg, run_dir, opts, batch_log, array_map)

    ex = _executor_type()(folder=str(folder), max_num_timeout=10**6)
    ex.script = script
    ex.update_parameters(
        additional_parameters={k.replace("-", "_"): v for k, v in options.items()},
        signal_delay_s=int(cfg.cluster.signal_lead_s),
        srun_args=flags.srun_args(cfg),
        array_parallelism=parallelism or 256,
    )
    return ex


def _first_submission_options(
    cfg: RootConfig, after: Optional[str], run_dir: Optional[str] = None
) -> dict[str, flags.Flag]:
    """The #SBATCH flags of the first submission: job.sbatch's, and the dependencies only it
    carries (`after`, cluster.sbatch_extra.dependency)."""
    options = flags.sbatch_options(cfg, job_name(cfg, run_dir))
    waits = [f"afterok:{flags.checked('dependency', after)}"] if after else []
    waits += [d for d in [flags.user_dependency(cfg)] if d]
    if waits:
        options["dependency"] = ",".join(waits)  # all of them (Slurm: `,` is AND)
    if after:
        # Slurm cancels a job whose dependency can never be met (the smoke failed) instead of
        # leaving it PENDING with Reason=DependencyNeverSatisfied; down a chain too.
        options["kill-on-invalid-dep"] = "yes"
    return options


@functools.lru_cache(maxsize=1)
def _executor_type() -> type:
    """submitit's SlurmExecutor writing `script` (set per executor) instead of its own, sbatch
    retried safely, and nothing pickled. Made on first use: submitit loads only when queueing."""
    import submitit
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmJob

    class _Executor(submitit.SlurmExecutor):  # type: ignore[misc]  # submitit: not followed
        script: Callable[[int], str]

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return self.script(self.parameters.get("map_count") or 0)

        def _submit_command(self, command: str) -> SlurmJob:
            """submitit's own, with sbatch retried on transient errors and never twice queued
            (common/slurm_cmd.sbatch: a unique --comment token checked before each retry)."""
            uid = uuid.uuid4().hex
            folder = JobPaths.get_first_id_independent_folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f".submission_file_{uid}.sh"
            path.write_text(self._make_submission_file_text(command, uid))
            job_id = slurm_cmd.sbatch([], str(path))
            job = SlurmJob(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
            job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
            return job

        def _internal_process_submissions(self, delayed: list[object]) -> list[SlurmJob]:
            # Nothing to pickle: the script runs `python -m slurmtrain.compute.attempt RUN_DIR`.
            Path(self.folder).mkdir(parents=True, exist_ok=True)
            if len(delayed) == 1:
                return [self._submit_command("unused")]
            self.parameters["map_count"] = len(delayed)
            try:
                first = self._submit_command("unused")
            finally:
                self.parameters.pop("map_count", None)
            return [
                SlurmJob(folder=self.folder, job_id=f"{first.job_id}_{a}", tasks=[0])
                for a in range(len(delayed))
            ]

    return _Executor


def _no_task() -> None:
    """submitit's API takes a callable; ours runs from the batch script instead (see executor)."""


def prepare(cfg: RootConfig, run: RunDir) -> None:
    """Everything before queueing: cluster check (cached) and the hand-resubmittable job.sbatch."""
    check_cluster(cfg)
    if cfg.cluster.stage_env:  # packed once here (cached by its hash): the script names the pack
        stage_env.ensure_pack(cfg)
    run.sbatch.write_text(render_sbatch(cfg, run))
    container.write_bundle(cfg, run.path)  # cluster.container=oci: RUN_DIR/oci/config.json


def submit(
    cfg: RootConfig, run: RunDir, after: Optional[str] = None, link: Optional[Submitted] = None
) -> Submission:
    """Queue the run (after job `after` succeeds, if given). `link`: what ties a smoke chain's
    jobs together in their `submitted` rows (login/smoke.py: smoke_run, smoke_job_id(s) on the
    big run; smoke_of, smoke_part on a smoke job)."""
    prepare(cfg, run)
    job = executor(cfg, run.logs / "submitit", [str(run.path)], after=after).submit(_no_task)
    row = dataclasses.replace(
        link or Submitted(), executor="slurm", fingerprint=run.path.name, after=after or None
    )
    run.record(row, job_id=job.job_id)
    if cfg.faults.successor and not after:  # queued now, it ages in the queue beside the first
        # job (a smoke chain's big job gets its own when it starts: its smoke may fail)
        successor.queue(run, Where(job_id=job.job_id))
    waits = f" (after job {after} succeeds)" if after else ""
    print(f"slurmtrain: submitted job {job.job_id} for {run.path}{waits}")
    return Submission(job.job_id, "slurm")


def submit_array(items: Sequence[tuple[RootConfig, RunDir]], folder: Path) -> list[Submission]:
    """One `sbatch --array` for every sweep point (they must share their Slurm flags).

    The points' configs and the array's map are made durable together before sbatch, their
    `submitted` events together after it (common/durable.persist: the fsyncs run side by side
    instead of one after the other), so a crash cannot lose what was queued."""
    if not items:
        return []
    first = items[0][0]
    if first.cluster.stage_env:  # one pack for every point (cached by its hash)
        stage_env.ensure_pack(first)
    base = flags.sbatch_options(first, job_name(first))
    base_env = flags.script_env(first)  # the array's one script exports the first's cluster.env
    scripts = []
    for cfg, run in items:  # every point was checked against the cluster (prepare.check)
        options = flags.sbatch_options(cfg, job_name(first))  # the array's name is the first's
        if options != base or flags.script_env(cfg) != base_env:
            raise ConfigError(
                f"sweep point {run.path.name}: its Slurm flags or cluster.env differ from the "
                f"first point's; sweep cluster.*/nodes in separate submissions"
            )
        own = options if job_name(cfg) == job_name(first) else None  # job.sbatch: its own name
        scripts.append((run.sbatch, render_sbatch(cfg, run, own, recorded=True)))
    # Nothing written unless every point could be rendered; then written side by side.
    in_parallel(lambda script: script[0].write_text(script[1]), scripts)
    for cfg, run in items:
        container.write_bundle(cfg, run.path)
    # Array tasks share one script: the supervisor finds its run by SLURM_ARRAY_TASK_ID in this map.
    folder.mkdir(parents=True, exist_ok=True)
    mapping = folder / f"sweep-{int(time.time() * 1000)}.json"
    mapping.write_text(json.dumps([str(run.path) for _, run in items]))
    ex = executor(
        first, folder, [], parallelism=first.cluster.array_parallelism, array_map=str(mapping)
    )
    # What a single run fsyncs one file at a time, here all at once: configs and their entries,
    # and the map the array's tasks read.
    persist([folder, mapping, *(p for _, run in items for p in (run.config, run.path))])
    with ex.batch():
        jobs = [ex.submit(_no_task) for _ in items]
    in_parallel(
        lambda done: done[1].record(
            Submitted(executor="slurm", fingerprint=done[1].path.name),
            job_id=done[0].job_id,
            durable=False,
        ),
        [(job, run) for job, (_, run) in zip(jobs, items)],
    )
    persist(p for _, run in items for p in (run.ledger_dir, *run.ledger_files()))
    return [Submission(job.job_id, "slurm") for job in jobs]
