"""The login node's one flow, for a single run, a sweep's points and the smoke chain.

compose (Hydra) -> prepare each point (validate, plan, run directory: login/prepare.py) ->
dry run: print and stop | record -> submit (one job; a job array for a Slurm sweep; the smoke chain
first when smoke=true). `python -m slurmtrain` calls `launch_one`; the Hydra launcher calls `launch`.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Optional, Sequence

from omegaconf import DictConfig

from slurmtrain.common import secrets
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import Stopped
from slurmtrain.common.windows import current_stop
from slurmtrain.login import cluster_check, placement
from slurmtrain.login.prepare import Prepared, check, check_points, record, resolved
from slurmtrain.login.submit import submit

Point = tuple[DictConfig, list[str]]  # a composed config and the overrides that made it


def launch_one(cfg: DictConfig, overrides: list[str]) -> int:
    """`python -m slurmtrain KEY=VALUE...`: one run; returns the process exit code."""
    return launch([(cfg, overrides)], copy=True)


def warm_up(kind: str) -> Callable[[], None]:
    """Start asking, in the background, what every point will need and this process caches: Git's
    state, the installed packages and the platform (`uname -p`) for provenance, Slurm's partitions
    (cluster=slurm/auto). A sweep composes its points meanwhile. Returns the wait; a failure
    there is left to the flow to meet and report, where it would have happened anyway."""
    from slurmtrain.common import provenance  # start-up: importlib.metadata; a dry run never asks

    cwd = os.getcwd()
    jobs: list[Callable[[], object]] = [
        lambda: (provenance.git_state(cwd), provenance.packages(), provenance.versions())
    ]
    if kind in ("slurm", "auto"):
        # cluster=slurm: partitions() reads the probe's (cluster=auto, gpus_per_node=auto)
        jobs.append(cluster_check.partitions if kind == "slurm" else placement.probe_slurm)
    threads = [threading.Thread(target=_quietly, args=(job,), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()

    def wait() -> None:
        for thread in threads:
            thread.join()

    return wait


def _quietly(job: Callable[[], object]) -> None:
    try:
        job()
    except Exception:  # noqa: BLE001  asked again (and reported) by the flow itself
        pass


def launch(
    points: Sequence[Point], copy: bool = False, ready: Optional[Callable[[], None]] = None
) -> int:
    """Every point validated and planned before anything is queued: one bad point, nothing submitted.
    `ready`: wait for warm_up's answers (before anything uses them)."""
    if ready is not None:
        ready()
    made = [resolved(cfg, copy=copy) for cfg, _ in points]
    # After the keys are known good: a refused key gets its one line, not a warning beside it.
    secrets.warn_given_in_clear(sys.argv[1:])  # what `ps` shows (Hydra's overrides: resolved)
    points = [(cfg, list(o)) for (cfg, _), (_, o) in zip(made, points)]
    single = len(points) == 1
    if any(cfg.dry_run for cfg, _ in points):
        return dry_run(points)
    if not single and any(cfg.smoke for cfg, _ in points):
        raise ConfigError(
            "smoke=true: not for sweeps (-m); smoke one point first, then sweep with smoke=false"
        )
    # The runs' locks are held from the state check until `submitted` is recorded (check()).
    with ExitStack() as locks:
        return _submit_checked(points, single, locks, [raw for _, raw in made])


def _submit_checked(
    points: list[Point], single: bool, locks: ExitStack, raws: list[Optional[dict[str, object]]]
) -> int:
    """`raws`: each point's config as schema.plain gives it, where resolved() knew it."""
    checked = (
        [check(points[0][0], locks=locks)]
        if single
        else check_points([cfg for cfg, _ in points], locks, raws)
    )
    todo = [(p, o) for p, (_, o) in zip(checked, points) if p is not None]
    if not todo:
        if not single:
            print(
                f"slurmtrain: all {len(points)} sweep points are finished or queued; "
                f"nothing submitted"
            )
        return 0
    if single and todo[0][0].cfg.smoke:  # validate() allows it on Slurm only
        from slurmtrain.login import smoke  # start-up: only smoke=true needs the chain

        return smoke.submit_chain(*todo[0])
    array = not single and todo[0][0].cfg.cluster.kind == "slurm"
    for prepared, _ in todo:
        _new_window(prepared)
    if array:  # an array syncs all points at once; their files are made side by side
        _record_all(todo)
        return _submit_array(todo, len(points))
    for prepared, overrides in todo:
        record(prepared, overrides)
    code = 0
    headers = point_headers([o for _, o in todo], [p.run.path for p, _ in todo])
    for (prepared, _), header in zip(todo, headers):
        if not single:
            print(header)
        result = submit(prepared.typed_cfg, prepared.run)
        if result.finished:
            print(f"slurmtrain: run finished: {prepared.run.path}")
        code = code or result.exit_code
    return code


def _record_all(todo: list[tuple[Prepared, list[str]]]) -> None:
    """Each point's files (~10 creations: a few ms on a busy disk, most of it waiting for the
    journal) written on a few threads, so the waits overlap; the first point alone first, so the
    shared directories above the runs are made once. A failure is raised after the rest ended."""
    from slurmtrain.common.durable import in_parallel

    record(*todo[0], durable=False)
    if any(p.cfg.resume_from for p, _ in todo):  # branches record into a shared parent: in turn
        for point in todo[1:]:
            record(*point, durable=False)
        return
    in_parallel(lambda point: record(*point, durable=False), todo[1:])


def point_headers(overrides: Sequence[Sequence[str]], runs: Sequence[Path]) -> list[str]:
    """A local sweep's line before each point's output: which point, the values that tell it
    apart (`optim.lr=0.0003`), its run directory."""
    from slurmtrain.cli.status_select import SHARED, override_key, varied  # plain functions

    given = [[o for o in point if override_key(o) not in SHARED] for point in overrides]
    total = len(runs)
    return [
        f"slurmtrain: sweep point {i}/{total}: {' '.join(items) or 'no overrides'} ({run})"
        for i, (items, run) in enumerate(zip(varied(given), runs), 1)
    ]


def _new_window(prepared: Prepared) -> None:
    """A resumed run that a budget stopped: say why it stopped and that this submission starts
    the failure budgets again (its first start records `budget_window`, common/windows.py)."""
    if not prepared.resumed:
        return
    stop = current_stop(prepared.run.run_events())
    if isinstance(stop, Stopped):
        why = stop.error.strip().splitlines()[-1:] or ["-"]
        print(
            f"slurmtrain: it stopped ({stop.cls}: {why[0][:200]}); the failure budgets "
            f"count again from this submission"
        )


def dry_run(points: Sequence[Point]) -> int:
    """Show the plan (one point) or one line per point and a summary (a sweep); nothing is queued
    and the run directories stay unwritten. Exits 2 when the same command without dry_run=true
    would be refused (login/dry_run.py)."""
    from slurmtrain.login.dry_run import show, sweep  # start-up speed: jinja2, for a dry run only

    return show(points[0][0]) if len(points) == 1 else sweep(points)


def _submit_array(todo: list[tuple[Prepared, list[str]]], total: int) -> int:
    from slurmtrain.login.slurm_submit import submit_array  # start-up speed: jinja2, submitit

    folder = Path(todo[0][0].cfg.runs_root) / ".sweeps" / "submitit"
    subs = submit_array([(p.typed_cfg, p.run) for p, _ in todo], folder)
    print(
        f"slurmtrain: submitted job array {subs[0].job_id.split('_')[0]} with {len(subs)} of "
        f"{total} sweep points"
    )
    for sub, (p, _) in zip(subs, todo):
        print(f"  {sub.job_id}  {p.run.path}")
    return 0
