"""`smoke=true`: a small job first; the big one starts only if it passed.

The smoke run is the same code, data and model family at 1 node, at most 2 layers, 20 steps. It is
two jobs on one run directory: the first saves at step 10 and stops, the second (`afterok`)
resumes in fresh processes and finishes, so save AND load are proven through the real resume path;
every failure budget but preemption's is 0. The big job waits with `afterok` and
`--kill-on-invalid-dep`: Slurm cancels it if the smoke fails, and `status` shows why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, TypedDict

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common import derived, events, ledger, rundir, validation
from slurmtrain.common.events import FailureClass
from slurmtrain.login.composed import typed
from slurmtrain.login.prepare import Prepared, record
from slurmtrain.planning import preflight

SMOKE_STEPS = 20
SMOKE_SAVE_STEP = 10  # the first smoke job saves here and stops; the second loads it
SMOKE_SUFFIX = "-smoke"


def smoke_config(cfg: DictConfig) -> DictConfig:
    """The smoke run's config, derived from the big run's resolved one."""
    small = cfg.copy()
    OmegaConf.set_readonly(small, False)
    typed_big, typed_small = typed(cfg), typed(small)
    accum = derived.grad_accumulation(typed_big, derived.world_size(typed_big))
    small.name = f"{cfg.name}{SMOKE_SUFFIX}"
    small.smoke = False
    small.nodes = 1
    small.model.num_layers = min(2, int(cfg.model.num_layers))
    small.train.max_steps = SMOKE_STEPS
    small.train.pause_at_step = SMOKE_SAVE_STEP
    small.train.log_interval = min(int(cfg.train.log_interval), 5)
    if cfg.train.flops_profile_step > SMOKE_STEPS:
        small.train.flops_profile_step = 0
    small.checkpoint.interval_steps = SMOKE_SAVE_STEP
    small.checkpoint.interval_minutes = 0.0
    # Same work per rank and step as the big run (same memory profile), on one node.
    small.train.global_batch_size = (
        cfg.train.micro_batch_size
        * accum
        * derived.data_parallel(typed_small, derived.world_size(typed_small, 1))
    )
    for cls in events.FAILURE_CLASSES:
        if cls != FailureClass.preempted:  # a preempted smoke is requeued under the same job id
            small.faults[events.budget_key(cls)] = 0
    validation.validate_config(typed_small, submitting=True)
    return small


def smoke_overrides(overrides: list[str], small: DictConfig) -> list[str]:
    """overrides.yaml of the smoke run: the user's, then what the smoke changed."""
    return (
        list(overrides)
        + [
            f"name={small.name}",
            "nodes=1",
            f"model.num_layers={small.model.num_layers}",
            f"train.max_steps={SMOKE_STEPS}",
            f"train.pause_at_step={SMOKE_SAVE_STEP}",
            f"checkpoint.interval_steps={SMOKE_SAVE_STEP}",
            f"train.global_batch_size={small.train.global_batch_size}",
        ]
        + [
            f"faults.{events.budget_key(c)}=0"
            for c in events.FAILURE_CLASSES
            if c != FailureClass.preempted
        ]
    )


def locate_smoke(small: DictConfig) -> tuple[rundir.RunDir, bool]:
    """(run directory, already passed). A smoke that did not finish is never resumed: its budgets
    are spent; a fresh replica runs instead."""
    preflight.report(typed(small), measured_tps=None).enforce(typed(small))
    run = rundir.locate(small)
    state = run.state()
    if state == rundir.FINISHED and not small.new_run:
        return run, True
    if state != rundir.NEW:
        small.new_run = True
        run = rundir.locate(small)
    return run, False


def submit_chain(big: Prepared, overrides: list[str]) -> int:
    """Smoke jobs, then the big job after them. `big` is checked, not yet recorded."""
    from slurmtrain.login import slurm_submit  # start-up speed: jinja2, for a smoke chain only

    small = smoke_config(big.cfg)
    smoke_run, passed = locate_smoke(small)
    if passed:
        print(f"slurmtrain: smoke test of this config already passed: {smoke_run.path}")
        record(big, overrides)
        link = events.Submitted(smoke_run=str(smoke_run.path))
        slurm_submit.submit(big.typed_cfg, big.run, link=link)
        return 0
    prepared = Prepared(small, smoke_run, resumed=False)
    record(prepared, smoke_overrides(overrides, small))
    typed_small = typed(small)
    gates = str(big.run.path)
    first = slurm_submit.submit(
        typed_small, smoke_run, link=events.Submitted(smoke_of=gates, smoke_part=1)
    )
    second = slurm_submit.submit(
        typed_small,
        smoke_run,
        after=first.job_id,
        link=events.Submitted(smoke_of=gates, smoke_part=2),
    )
    record(big, overrides)
    slurm_submit.submit(
        big.typed_cfg,
        big.run,
        after=second.job_id,
        link=events.Submitted(
            smoke_job_id=second.job_id,
            smoke_job_ids=(first.job_id, second.job_id),
            smoke_run=str(smoke_run.path),
        ),
    )
    print(
        f"slurmtrain: smoke test first: jobs {first.job_id} (save at step {SMOKE_SAVE_STEP}) "
        f"-> {second.job_id} (load, finish) in {smoke_run.path}; the big job starts only if "
        f"they succeed"
    )
    return 0


# Why a big run waits for (or was cancelled by) its smoke run: what `cli status` shows.
SmokeHold = TypedDict(
    "SmokeHold",
    {"state": str, "class": Optional[str], "error": Optional[str], "smoke_run": str},
    total=False,  # merged into a status row
)


def blocked(big_rows: events.Rows) -> Optional[SmokeHold]:
    """Why a big run (its ledger rows) that has not started waits or will never start, from its
    smoke run; None when no smoke holds it (or it passed)."""
    subs = [e for e in big_rows if isinstance(e, events.Submitted)]
    if not subs or not subs[-1].smoke_run or not subs[-1].smoke_job_id:
        return None
    last = subs[-1]
    if any(isinstance(e, events.Started) and e.time >= last.time for e in big_rows):
        return None
    smoke = rundir.RunDir(Path(str(last.smoke_run)))
    rows = smoke.events()
    if any(isinstance(e, events.Finished) for e in rows):
        return None
    stops = [e for e in rows if isinstance(e, (events.Stopped, events.Failed))]
    if not stops and smoke.state() == rundir.RUNNING:
        return {
            "state": "waiting: smoke test",
            "class": None,
            "error": None,
            "smoke_run": str(smoke.path),
        }
    error = ledger.last_error(rows) or (stops[-1].error or None if stops else None)
    cls = next((e.cls for e in reversed(stops) if e.cls), None)
    return {
        "state": "blocked: smoke failed",
        "class": f"smoke {cls}" if cls else "smoke",
        "error": error or f"the smoke job ended without finishing; see {smoke.path}",
        "smoke_run": str(smoke.path),
    }
