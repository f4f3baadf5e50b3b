"""The ledger rows an attempt writes about what it measured and how its checkpoints went, and the
supervisor's verdict on a failed one: part of the vocabulary (common/events.py re-exports every
class here; import them from there).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from slurmtrain.common.row_codec import Row

__all__ = [
    "HealthOk",
    "RendezvousDone",
    "Startup",
    "Deadlines",
    "Rollback",
    "ResumeApplied",
    "CheckpointSaved",
    "CheckpointFailed",
    "CheckpointLoaded",
    "CheckpointSkipped",
    "CheckpointVerified",
    "CheckpointConverted",
    "CheckpointUnloadable",
    "Straggler",
    "MemoryChecked",
    "FlopsProfile",
    "TrackerFailed",
    "ResumeSource",
    "AttemptVerdict",
    "Confidence",
]


@dataclass(frozen=True, kw_only=True)
class HealthOk(Row):
    """Attempt: every rank passed the health gate."""

    kind = "health_ok"
    seconds: Optional[float] = None
    allreduce_gbps: Optional[float] = None
    intra_node_gbps: Optional[float] = None
    inter_node_gbps: Optional[float] = None
    fabric: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class RendezvousDone(Row):
    """Attempt: the ranks' process group is up."""

    kind = "rendezvous_done"
    seconds: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class Startup(Row):
    """Attempt, after the first step: seconds per start-up phase (compute/startup.py)."""

    kind = "startup"
    phases: Optional[dict[str, object]] = None
    seconds: Optional[float] = None
    process_started_at: Optional[float] = None
    torch_from: Optional[str] = None
    python: Optional[str] = None
    staged_env: Optional[str] = None
    build_skipped_init: Optional[bool] = None


@dataclass(frozen=True, kw_only=True)
class Deadlines(Row):
    """Attempt: its phase deadlines and the IO rates behind them (planning/deadlines.py)."""

    kind = "deadlines"
    step_s: Optional[float] = None
    startup_s: Optional[float] = None
    io_floor_s: Optional[float] = None
    io_safety: Optional[float] = None
    world_size: Optional[int] = None
    node_count: Optional[int] = None
    write_mb_per_s: Optional[float] = None
    read_mb_per_s: Optional[float] = None
    write_rate: Optional[str] = None
    read_rate: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Rollback(Row):
    """Attempt: a diverged step rolled back in-process, skipping the data window."""

    kind = "rollback"
    durable = True
    tracked = True
    step: Optional[int] = None
    loss: Optional[float] = None  # NaN/inf written as text (JSON has none), read back as floats
    reason: Optional[str] = None
    to_step: Optional[int] = None
    path: Optional[str] = None
    skipped_steps: Optional[int] = None
    skipped_samples: Optional[int] = None
    data_skip: Optional[int] = None
    number: Optional[int] = None
    seconds: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class ResumeApplied(Row):
    """Attempt: train.resume=none|step_N applied (the rest moved aside); saves count from here."""

    kind = "resume_applied"
    resume: Optional[str] = None
    moved: tuple[str, ...] = ()
    kept_step: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Row):
    """Attempt: a checkpoint was published."""

    kind = "checkpoint_saved"
    durable = True
    tracked = True
    step: Optional[int] = None
    seconds: Optional[float] = None
    total_seconds: Optional[float] = None
    wait_seconds: Optional[float] = None
    bytes: Optional[int] = None
    path: Optional[str] = None
    mode: Optional[str] = None
    world_size: Optional[int] = None
    rank_bytes: Optional[int] = None
    write_seconds: Optional[dict[str, object]] = None
    data_position: Optional[dict[str, object]] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed(Row):
    """Attempt: a save failed; earlier ones are intact."""

    kind = "checkpoint_failed"
    tracked = True
    step: Optional[int] = None
    error: Optional[str] = None
    path: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointLoaded(Row):
    """Attempt: resumed from a checkpoint."""

    kind = "checkpoint_loaded"
    tracked = True
    step: Optional[int] = None
    seconds: Optional[float] = None
    rank_bytes: Optional[int] = None
    world_size: Optional[int] = None
    path: Optional[str] = None
    world_size_changed: Optional[bool] = None
    skipped_samples: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointSkipped(Row):
    """Attempt: the resume choice passed a checkpoint over."""

    kind = "checkpoint_skipped"
    tracked = True
    path: Optional[str] = None
    reason: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointVerified(Row):
    """Attempt: the ranks verified a checkpoint before loading it."""

    kind = "checkpoint_verified"
    path: Optional[str] = None
    ok: Optional[bool] = None
    reason: Optional[str] = None
    world_size: Optional[int] = None
    files: Optional[int] = None
    bytes: Optional[int] = None
    rank_bytes: Optional[int] = None
    seconds: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointConverted(Row):
    """Attempt: another world size's checkpoint converted (or its cached copy reused)."""

    kind = "checkpoint_converted"
    step: Optional[int] = None
    path: Optional[str] = None
    seconds: Optional[float] = None
    cached: Optional[bool] = None
    from_world_size: Optional[int] = None
    to_world_size: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class CheckpointUnloadable(Row):
    """Attempt: a checkpoint failed to load; marked, the one before is tried."""

    kind = "checkpoint_unloadable"
    tracked = True
    step: Optional[int] = None
    path: Optional[str] = None
    error: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Straggler(Row):
    """Attempt, at most one a log interval: the slowest node (`node`, its slowest `rank`) passed
    faults.straggler_threshold x the median rank's data+forward time (`factor`); `history`: that
    rank's time over its own past windows; `windows`: intervals in a row above the threshold;
    `chronic`: that reached faults.straggler_windows; `excluded`: offered to the bad-node ledger."""

    kind = "straggler"
    tracked = True
    factor: Optional[float] = None
    step: Optional[int] = None
    history: Optional[float] = None
    windows: Optional[int] = None
    chronic: Optional[bool] = None
    excluded: Optional[bool] = None


@dataclass(frozen=True, kw_only=True)
class MemoryChecked(Row):
    """Attempt: measured peak memory against the plan."""

    kind = "memory_checked"
    tracked = True
    step: Optional[int] = None
    measured_bytes: Optional[int] = None
    planned_bytes: Optional[int] = None
    ratio: Optional[float] = None
    planned_parts: Optional[dict[str, object]] = None


@dataclass(frozen=True, kw_only=True)
class FlopsProfile(Row):
    """Attempt: DeepSpeed's flops profile of one step against the model's count."""

    kind = "flops_profile"
    step: Optional[int] = None
    path: Optional[str] = None
    fwd_flops_per_micro_batch: Optional[float] = None
    flops_per_token_measured: Optional[float] = None
    flops_per_token_model: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class TrackerFailed(Row):
    """Attempt, rank 0: a tracker (TensorBoard, W&B, MLflow, Aim) failed at `phase` (open, write
    or close) and was dropped; training went on (metrics.jsonl holds every row). Durable: `status`
    warns about it even when the attempt dies next."""

    kind = "tracker_failed"
    durable = True
    tracker: Optional[str] = None
    phase: Optional[str] = None  # open | write | close
    error: Optional[str] = None  # short: type and message, secrets redacted


@dataclass(frozen=True, kw_only=True)
class ResumeSource(Row):
    """Attempt, per rank: the tier a rank's resume reads (`local`, `buddy`, `shared`) at the step
    every rank agreed on, and why a better tier was passed over (compute/checkpoint/local_tier.py)."""

    kind = "resume_source"
    step: Optional[int] = None
    tier: Optional[str] = None
    reason: Optional[str] = None  # the fallback's cause; None when the own local copy loads


class Confidence(StrEnum):
    """How sure an `attempt_verdict` is of its culprit (the words: batch/culprit.py)."""

    high = "high"
    medium = "medium"
    low = "low"


@dataclass(frozen=True, kw_only=True)
class AttemptVerdict(Row):
    """Supervisor, right after a failed attempt's `attempt_ended` (batch/culprit.py): its class,
    the rank and node it blames (`culprit_rank`, `culprit_node`), or why none (`no_culprit`:
    "configuration/user" for an error any node would repeat), how sure (`confidence`: high, medium,
    low) and the evidence, one line each. Placement names the attempt, never the culprit."""

    kind = "attempt_verdict"
    closing = True
    cls: str
    culprit_rank: Optional[int] = None
    culprit_node: Optional[str] = None
    no_culprit: Optional[str] = None
    confidence: str = ""
    evidence: tuple[str, ...] = ()
