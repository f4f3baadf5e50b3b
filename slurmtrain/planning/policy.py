"""The plan's defaults for a big run: the time limit of an attempt and the checkpoint policy.

- `cluster.time=auto`: the partition's MaxTime (login/placement.py reads it when Slurm answers),
  capped at `cluster.time_cap` (queues favour shorter jobs; a day or two bounds what a bad node
  wastes); the cap itself when the partition is unknown (a dry run without Slurm), said so.
- `checkpoint.interval_steps=auto`: on GPUs, Young/Daly's interval sqrt(2 x save x MTBF) from the
  planned save (the bytes a save moves over the aggregate rate, planning/deadlines.py; the run's
  own measured save time once the ledger has one) and the job's MTBF (any of its nodes failing
  stops it: `faults.node_mtbf_h` / nodes), saved by time (`interval_minutes`), so a wrong
  throughput guess does not move it. CPU runs (demos, tests) keep 25 steps.
- `checkpoint.async_save=auto`: on for GPUs (the loop waits only for a copy to host memory).
- `checkpoint.local_every_steps=auto`: the node-local tier's interval (planning/local_tier_plan.py).
Values set by hand always win. Pure arithmetic and config: no torch, no Slurm calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import Row
from slurmtrain.common.schema import ClusterKind, Container, RootConfig, VerifyMode
from slurmtrain.common.slurm_text import PartitionInfo, format_time
from slurmtrain.planning import cards, ckpt_interval, deadlines, flops, local_tier_plan, mfu
from slurmtrain.planning.eta import slurm_time_seconds

AUTO = "auto"
CPU_INTERVAL_STEPS = 25  # demos and tests on CPU ranks: the interval they always had
# Assumptions of a plan before anything was measured (each printed where it is used):
STARTUP_S = (
    120.0  # an attempt's start-up besides its checkpoint IO: imports, rendezvous, health, build
)
SAVE_FIXED_S = 5.0  # a save's fixed costs: fsync, manifest, rename, the `latest` pointer
HOST_COPY_BPS = 5e9  # async saves: the loop waits while the rank's state is copied to host memory
HOUR = 3600.0


def time_limit(
    requested: str, cap: str, part: Optional[PartitionInfo], unknown_why: str = ""
) -> tuple[str, str]:
    """(cluster.time, where it came from): the value set by hand, else the partition's MaxTime
    capped at `cap`, else (partition unknown or UNLIMITED) the cap."""
    if str(requested) != AUTO:
        return str(requested), "set by hand"
    cap_s = slurm_time_seconds(cap, "cluster.time_cap")
    if cap_s is None:
        raise ConfigError(
            f"cluster.time_cap={cap!r}: must be a finite Slurm time (the longest attempt "
            f"cluster.time=auto asks for); e.g. cluster.time_cap=48:00:00"
        )
    capped = format_time(int(cap_s))
    if part is None:
        why = f" ({unknown_why})" if unknown_why else ""
        return capped, (
            f"partition unknown{why}: the cap cluster.time_cap={cap} is used; "
            f"set cluster.time=HH:MM:SS to choose"
        )
    if part.max_time_s is None or part.max_time_s > cap_s:
        their = format_time(part.max_time_s)
        return capped, f"partition {part.name} MaxTime {their}, capped at cluster.time_cap={cap}"
    return format_time(part.max_time_s), f"partition {part.name}'s MaxTime"


def resolve_time(cfg: RootConfig, part: Optional[PartitionInfo], why: str = "") -> str:
    """Fill `cluster.time=auto` (mutates cfg; `cluster.time_from` says where it came from)."""
    value, note = time_limit(AUTO, cfg.cluster.time_cap, part, why)  # checks the cap, always
    if str(cfg.cluster.time) != AUTO:
        return cfg.cluster.time_from or "set by hand"
    cfg.cluster.time, cfg.cluster.time_from = value, note
    return note


def replan_time(cfg: RootConfig, part: Optional[PartitionInfo]) -> None:
    """A `cluster.time=auto` planned before the partition was read (detection off, or Slurm not
    asked yet) is planned again from the partition the job goes to: its MaxTime, not the cap."""
    planned = cfg.cluster.time_from
    if part is None or not planned or planned == "set by hand":
        return
    if str(planned).startswith("partition unknown"):
        cfg.cluster.time, cfg.cluster.time_from = time_limit(AUTO, cfg.cluster.time_cap, part)


def checkpoint_layout(cfg: RootConfig, nodes: int) -> deadlines.Layout:
    """The bytes each IO phase of this run's checkpoint moves on `nodes` nodes."""
    numbers = derived_of(cfg)
    return numbers.once(
        ("layout", nodes),
        lambda: deadlines.config_layout(cfg, nodes * numbers.per_node, nodes),
    )


def attempt_deadlines(
    cfg: RootConfig, nodes: int, events: Iterable[Row] = ()
) -> deadlines.Deadlines:
    numbers = derived_of(cfg)
    rows = tuple(events)
    return numbers.once(  # the rows are the run's ledger as read by this check
        (attempt_deadlines, nodes, len(rows)),
        lambda: deadlines.from_config(cfg.faults, rows, nodes * numbers.per_node, nodes),
    )


def tokens_per_step(cfg: RootConfig, world: int) -> Optional[float]:
    t, seq = cfg.train, cfg.data.seq_len
    if t.global_batch_size is not None:
        return float(t.global_batch_size * seq)
    if t.global_batch_tokens is not None:
        return float(t.global_batch_tokens)
    return float(t.micro_batch_size * t.grad_accumulation * world * seq)


def planned_tokens_per_s(cfg: RootConfig, world: int) -> tuple[Optional[float], str]:
    """The throughput a plan assumes before one was measured: the GPU's peak x the planned MFU
    (planning/mfu.py: set by hand, the GPU check's, or the table); None on CPUs or an unlisted
    GPU without `peak_tflops`: no honest guess."""
    return derived_of(cfg).once(("tokens/s", world), lambda: _planned_tokens_per_s(cfg, world))


def _planned_tokens_per_s(cfg: RootConfig, world: int) -> tuple[Optional[float], str]:
    peak = cards.peak_tflops(cfg, derived_of(cfg).dtype)
    if (cfg.gpus_per_node == 0 and not cfg.peak_tflops) or not peak:
        return None, ""
    fpt = flops.flops_per_token(cfg.model, cfg.data.seq_len)
    planned = mfu.planned(cfg)
    return world * peak * 1e12 * planned.value / fpt, f"MFU {planned.value:.0%}, an estimate"


@dataclass(frozen=True)
class CheckpointPlan:
    """Young/Daly's inputs and answer for one run (seconds)."""

    save_s: float  # a whole save, until published (Young/Daly's checkpoint cost)
    save_how: str  # planned | measured
    blocking_s: float  # what the training loop waits per save (async: the host copy)
    restart_s: float  # an attempt's start-up: STARTUP_S + verify + load
    mtbf_s: float  # the job's
    interval_s: float  # Young/Daly's optimum
    step_s: Optional[float]  # planned step time (None: no throughput guess)
    layout: deadlines.Layout

    def chosen_s(self, cfg: RootConfig) -> Optional[float]:
        """The interval the run will use (whichever of steps and minutes comes first)."""
        c = cfg.checkpoint
        found: list[float] = []
        if isinstance(c.interval_steps, int) and c.interval_steps > 0 and self.step_s:
            found.append(c.interval_steps * self.step_s)
        if c.interval_minutes:
            found.append(float(c.interval_minutes) * 60)
        if c.interval_steps == AUTO:
            found.append(self.interval_s)
        return min(found) if found else None

    def cost(self, interval_s: float) -> ckpt_interval.Outcome:
        """Where the wall time goes at `interval_s` (per unit of wall time): blocking saves, work
        lost to failures (an async save is lost until published: its write time counts there)."""
        lag = self.save_s - self.blocking_s
        return ckpt_interval.analytic(
            interval_s, self.blocking_s, self.restart_s + lag, self.mtbf_s, 1.0
        )


def checkpoints(cfg: RootConfig, nodes: int, saves: Iterable[Row] = ()) -> CheckpointPlan:
    """The checkpoint plan of this run on `nodes` nodes; `saves`: its `checkpoint_saved` rows."""
    lay = checkpoint_layout(cfg, nodes)
    d = attempt_deadlines(cfg, nodes)
    measured = ckpt_interval.measured_save_seconds(list(saves), worst=True, total=True)
    save = measured if measured is not None else d.seconds(lay.save, True) + SAVE_FIXED_S
    async_save = cfg.checkpoint.async_save
    if async_save == AUTO:
        async_save = cfg.gpus_per_node > 0
    blocking = min(save, lay.save.rank / HOST_COPY_BPS + 1.0) if async_save else save
    verify = d.seconds(lay.verify, False) if cfg.checkpoint.verify == VerifyMode.checksum else 0.0
    restart = STARTUP_S + verify + d.seconds(lay.load, False)
    mtbf = float(cfg.faults.node_mtbf_h) * HOUR / max(1, nodes)
    world = nodes * derived_of(cfg).per_node
    tps, _ = planned_tokens_per_s(cfg, world)
    per_step = tokens_per_step(cfg, world)
    return CheckpointPlan(
        save_s=save,
        save_how="planned" if measured is None else "measured",
        blocking_s=blocking,
        restart_s=restart,
        mtbf_s=mtbf,
        interval_s=ckpt_interval.young_daly_interval(save, mtbf),
        step_s=per_step / tps if tps and per_step else None,
        layout=lay,
    )


def resolve_checkpoint(cfg: RootConfig, saves: Iterable[Row] = ()) -> None:
    """Fill `checkpoint.async_save`, `interval_steps` and `local_every_steps` where auto (mutates
    cfg)."""
    c, gpus = cfg.checkpoint, cfg.gpus_per_node > 0
    if c.async_save == AUTO:
        c.async_save = gpus
    if not isinstance(c.async_save, bool):
        raise ConfigError(
            f"checkpoint.async_save={c.async_save!r}: must be true, false or auto (true on "
            f"GPUs); e.g. checkpoint.async_save=true"
        )
    planned = c.local_every_steps == AUTO and local_tier_plan.needs_plan(cfg)
    ckpt = checkpoints(cfg, derived_of(cfg).nodes[1], saves) if planned else None
    local_tier_plan.resolve(cfg, ckpt)  # the most nodes fail most
    if c.interval_steps != AUTO:
        if isinstance(c.interval_steps, bool) or not isinstance(c.interval_steps, int):
            raise ConfigError(
                f"checkpoint.interval_steps={c.interval_steps!r}: must be a whole number of "
                f"steps >= 0 (0: never by steps) or auto; e.g. checkpoint.interval_steps=1000"
            )
        return
    if not gpus:
        c.interval_steps = CPU_INTERVAL_STEPS
        return
    c.interval_steps = 0  # by time: Young/Daly's minutes (or the minutes set by hand)
    if not c.interval_minutes:
        plan = checkpoints(cfg, derived_of(cfg).nodes[1], saves)  # the most nodes fail most
        c.interval_minutes = float(max(1, round(plan.interval_s / 60)))


# From this many nodes the ranks' imports from the shared filesystem become a storm worth staging
# around (thousands of files x ranks at once; the headline's 64 nodes are well past it).
STAGE_ENV_ADVISED_NODES = 16


def stage_env_advice(cfg: RootConfig) -> Optional[str]:
    """The plan's line when cluster.stage_env is advisable and off (None otherwise)."""
    c, nodes = cfg.cluster, derived_of(cfg).nodes[1]
    if c.kind != ClusterKind.slurm or c.stage_env or c.container != Container.none:
        return None
    if nodes < STAGE_ENV_ADVISED_NODES:
        return None
    return (
        f"plan: {nodes * derived_of(cfg).per_node} ranks on {nodes} nodes import torch/deepspeed from "
        f"the shared filesystem at once; cluster.stage_env=true runs them from a node-local copy "
        f"(packed once, unpacked once per node: docs/scale.md)"
    )
