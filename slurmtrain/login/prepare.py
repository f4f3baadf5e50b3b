"""Before anything is queued: resolve and validate a config, plan it, find its run directory, record it.

validate -> plan (refuse what does not fit) -> find the run directory -> refuse a duplicate or
resume an unfinished run -> write config, overrides, provenance. login/launch.py strings these
together for a single run, a sweep and the smoke chain.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, cast

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common import derived, pretrained, rundir, secrets, text_corpus, validation
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import CheckpointSaved, Submitted
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.schema_keys import key_tree, unknown_key
from slurmtrain.login import branch, flags, run_locks, view
from slurmtrain.login.cluster_check import check_cluster
from slurmtrain.login.composed import typed
from slurmtrain.login.placement import announce, resolve_auto
from slurmtrain.planning import preflight
from slurmtrain.planning.shapes import param_count


@dataclass
class Prepared:
    cfg: DictConfig
    run: rundir.RunDir
    resumed: bool
    data: Optional[dict[str, object]] = None  # cfg as fingerprinted: what record writes
    # The checked config as plain dataclasses (OmegaConf.to_object): what the plan and the
    # submission read, ~30x faster per attribute than the DictConfig (a sweep reads it per point).
    view: Optional[RootConfig] = None
    raw: Optional[dict[str, object]] = None  # cfg as a plain dict, secrets' values kept
    submissions: Optional[int] = None  # `submitted` rows in the ledger when its state was read

    @property
    def typed_cfg(self) -> RootConfig:
        return self.view if self.view is not None else typed(self.cfg)


def resolve(cfg: DictConfig, copy: bool = True) -> DictConfig:
    """The config as it will be recorded: `hydra` removed, runs_root absolute, batch derived."""
    return resolved(cfg, copy)[0]


def resolved(cfg: DictConfig, copy: bool = True) -> tuple[DictConfig, Optional[dict[str, object]]]:
    """resolve(), and the config as schema.plain gives it (what check fingerprints and record
    writes), when known without making it again (None: check makes it)."""
    if copy:
        cfg = cfg.copy()
    if "hydra" in cfg:
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        OmegaConf.set_struct(cfg, True)
    typed_cfg = typed(cfg)
    typed_cfg.runs_root = os.path.abspath(os.path.expanduser(typed_cfg.runs_root))
    pretrained.resolve_config(typed_cfg)  # model=hf: model.config read into the model keys
    pretrained.resolve(typed_cfg)  # model.pretrained_checksum: the source is fingerprinted
    text_corpus.resolve(typed_cfg, build=not typed_cfg.dry_run)  # data=text: tokenized once
    checked, raw = _validated(cfg, submitting=not typed_cfg.dry_run)  # cluster=auto etc. first
    _check_slurm_values(checked)
    refuse_inject_unless_allowed(bool(typed_cfg.faults.allow_inject))
    branch.resolve(cfg)  # resume_from: the parent's step checked; the lineage is fingerprinted
    if typed_cfg.resume_from or (raw or {}).get("branch_of") is not None:
        raw = None  # branch_of written: plain() again
    return cfg, raw


def _validated(cfg: DictConfig, submitting: bool) -> tuple[RootConfig, Optional[dict[str, object]]]:
    """placement.resolve_auto (cluster=auto, gpus_per_node=auto) and validation.validate_config,
    run on the config's dataclass view (login/view.py) with what they fill in written back; on
    the DictConfig itself when the view cannot be built (a missing value, a key the schema lacks:
    the errors validation words) or its check fails on something else than the config. With it,
    schema.plain(cfg) as it is now (login/view.validated), or None."""

    def check(config: RootConfig) -> None:
        resolve_auto(config)
        validation.validate_config(config, submitting)

    try:
        raw, texts = view.plain_and_references(cfg)
        if unknown_key(raw, key_tree(RootConfig)) is None:
            checked = view.build(raw)
            return checked, view.validated(cfg, checked, check, raw, texts)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001  the DictConfig's validation reports it, as it always did
        pass
    check(typed(cfg))
    return typed(cfg), None


def _check_slurm_values(cfg: RootConfig) -> None:
    """Every #SBATCH value and cluster.env name is checked whatever cluster.kind is: a config
    made for cluster=local is still refused, in one line, if it would not render for Slurm.
    Each cluster.secrets name must be set in this shell (its value is what the job gets)."""
    flags.sbatch_options(cfg, f"st-{cfg.name}")
    flags.job_env(cfg)
    flags.srun_args(cfg)
    flags.master_port(cfg)
    flags.job_comment(cfg, None)
    flags.user_dependency(cfg)
    secrets.check_named({"cluster": {"secrets": list(cfg.cluster.secrets or [])}})


def refuse_inject_unless_allowed(allowed: bool, env: Mapping[str, str] = os.environ) -> None:
    """SLURMTRAIN_INJECT (compute/faults/inject.py) set without faults.allow_inject=true: a drill's
    setting left in the shell would reach a production job; refused before anything is written."""
    value = env.get("SLURMTRAIN_INJECT", "").strip()
    if value and not allowed:
        raise ConfigError(
            f"SLURMTRAIN_INJECT={value!r}: fault injection is for tests and drills; add "
            f"faults.allow_inject=true to the command to inject, or `unset SLURMTRAIN_INJECT`"
        )


def check(
    cfg: DictConfig, quiet: bool = False, locks: Optional[ExitStack] = None
) -> Optional[Prepared]:
    """Plan and locate; None (with the reason printed) when there is nothing to submit.

    `locks`: the run's exclusive lock is taken into it before the state check; the caller holds
    it until the `submitted` event is recorded, so two shells submitting the same config at once
    queue one job. The state check fails closed: when Slurm cannot say whether the run's job is
    alive, StateUnknown (a ConfigError: one line, exit 2) refuses instead of resubmitting."""
    planned = plan(cfg, quiet)
    if locks is not None:
        run_locks.take([planned.run], str(cfg.runs_root), locks)
    return settle(planned)


def check_points(
    cfgs: Sequence[DictConfig],
    locks: ExitStack,
    raws: Optional[Sequence[Optional[dict[str, object]]]] = None,
) -> list[Optional[Prepared]]:
    """check() for a sweep's points: every point planned first, then their locks taken side by
    side (each lock creates a lease file: one after the other, 64 of them wait long on a busy
    disk), then each point's state checked."""
    raws = raws if raws is not None else [None] * len(cfgs)
    planned = [plan(cfg, quiet=True, raw=raw) for cfg, raw in zip(cfgs, raws)]
    if planned:
        run_locks.take([p.run for p in planned], str(cfgs[0].runs_root), locks)
    return [settle(p) for p in planned]


def plan(cfg: DictConfig, quiet: bool = False, raw: Optional[dict[str, object]] = None) -> Prepared:
    """Plan (refused in one line when it does not fit), print it unless `quiet`, locate the run
    directory; nothing is written. `raw`: schema.plain(cfg) when resolved() knew it."""
    typed_cfg = typed(cfg)
    raw = raw if raw is not None else view.plain(cfg)
    checked = snapshot(cfg, raw)
    report = preflight.report(checked, measured_tps=None)
    report.enforce(checked)  # before printing: a refusal is one line
    if checked.cluster.kind == "slurm":
        check_cluster(
            typed_cfg, checked
        )  # cluster.time=auto: planned again from the partition's MaxTime
        if typed_cfg.cluster.time != checked.cluster.time:
            raw = view.plain(cfg)
            checked = snapshot(cfg, raw)
            report = preflight.report(checked, measured_tps=None)
    if not quiet:
        announce()  # "auto: cluster=slurm (...)": once the command is not refused
        print(report.shown)  # wrapped to 120 columns
        note = flags.port_note(typed_cfg)
        if note:
            print(note)
    # Fingerprinted, then written (record): secrets as references, so neither config.yaml nor the
    # run's name depends on a key's value (a rotated token resumes the same run).
    data = _referenced(raw)
    run = rundir.locate(cfg, data)
    return Prepared(cfg, run, resumed=False, data=data, view=checked, raw=raw)


_REFERENCED: dict[str, object] = {}  # _referenced's sections, by their exact value


def _referenced(raw: dict[str, object]) -> dict[str, object]:
    """secrets.referenced(raw) (a walk per top-level section), each section made once per
    distinct value: a sweep's points share all but a few. Shared, so read only (as it is)."""
    out: dict[str, object] = {}
    for key, value in raw.items():
        memo = repr((key, value))  # exact: plain str/int/float/bool/None containers
        if memo not in _REFERENCED:
            if len(_REFERENCED) >= 4096:
                _REFERENCED.clear()
            _REFERENCED[memo] = secrets.referenced({key: value})[key]
        out[key] = _REFERENCED[memo]
    return out


def settle(p: Prepared) -> Optional[Prepared]:
    """The located run's state (its lock held): None, said why, when there is nothing to submit."""
    run = p.run
    rows = run.run_events()  # read once: the saves, the state, the submissions so far
    warning = preflight.lead_warning(
        p.typed_cfg, [e for e in rows if isinstance(e, CheckpointSaved)]
    )
    if warning:
        print(f"slurmtrain: {warning}")
    state = run.state(rows)
    if state == rundir.FINISHED:
        print(
            f"slurmtrain: this run already finished: {run.path}\n"
            f"slurmtrain: nothing to train; pass new_run=true to train the same config again"
        )
        return None
    if state == rundir.RUNNING:
        print(f"slurmtrain: this run is already queued or running: {run.path}")
        return None
    if state == rundir.STOPPED:
        print(f"slurmtrain: resuming unfinished run {run.path}")
    submissions = sum(isinstance(e, Submitted) for e in rows)
    return dataclasses.replace(p, resumed=state == rundir.STOPPED, submissions=submissions)


def snapshot(cfg: DictConfig, raw: dict[str, object]) -> RootConfig:
    """The checked config as RootConfig's dataclasses, read only (login/view.py), with the numbers
    derived from it attached (common/derived.Derived: each computed once, then read by the plan,
    the cluster check and the batch script); `raw`: schema.plain(cfg)."""
    try:
        made = view.build(raw)
    except Exception:  # noqa: BLE001  not expected once validated; OmegaConf's own then
        made = cast(RootConfig, OmegaConf.to_object(cfg))
    derived.attach(made, params=param_count(made.model))
    return made


def record(p: Prepared, overrides: list[str], durable: bool = True) -> None:
    """Write the run's config, overrides and provenance. `durable=False` (a sweep): nothing is
    fsynced here; the caller makes every point's config durable together (durable.persist).
    Secrets: references in config.yaml, overrides.yaml and provenance; values in the 0600
    RUN_DIR/secrets.env the batch script sources (common/secrets.py)."""
    from slurmtrain.common import provenance  # start-up: importlib.metadata; a dry run never asks

    overrides = secrets.redact_overrides(overrides)
    data = p.data if p.data is not None else secrets.referenced(p.cfg)
    if p.cfg.resume_from:  # the parent's step is pinned before the branch exists
        branch.pin(p.cfg, p.run)
    rundir.create(p.run, p.cfg, overrides, durable=durable, data=data)
    secrets.write_env_file(p.run.path, p.raw if p.raw is not None else p.cfg)
    if p.cfg.resume_from:
        branch.record(p.cfg, data, p.run)
    if not durable:  # created now, so `submitted` does not fsync its parent once per point
        p.run.ledger_dir.mkdir(exist_ok=True)
    provenance.write(
        p.run.provenance,
        f"submit_{_submissions(p) + 1}",
        extra={"overrides": overrides},
    )


def _submissions(p: Prepared) -> int:
    """`submitted` rows so far: as settle() read them (the run's lock held since), else now."""
    if p.submissions is not None:
        return p.submissions
    return sum(isinstance(e, Submitted) for e in p.run.run_events())
