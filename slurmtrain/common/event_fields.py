"""Each ledger event kind's row: when it is written, the fields it carries, whether it is fsynced.

The reference a reader of the ledger needs (what does a `checkpoint_saved` row hold?), and a
checked one: tests/unit/test_events.py walks every writer (`record`, `record_rank`, `record_any`)
and fails on a field its kind does not declare here. Every row also carries the placement fields
(`PLACEMENT`): what it is, when, and which start (and rank) wrote it. "attempt" below is the
attempt's rank 0 writing through `Attempt.record` (compute/context.py); "any rank" writes its
node's file of the rank tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmtrain.common.events import Kind, Where


@dataclass(frozen=True)
class Spec:
    """One kind's row. `durable`: fsynced before `RunDir.record` returns, because a later
    decision reads it. `fields`: what its writers add beyond `PLACEMENT`; a placement key listed
    here means something of this kind's own (node_lost's `node` is the node lost)."""

    durable: bool
    when: str
    fields: tuple[str, ...] = ()


# Keys any row may carry: the kind, the time, and the writer's placement (Where's keys).
PLACEMENT: frozenset[str] = frozenset({"event", "time", *Where.__annotations__})

SPECS: dict[Kind, Spec] = {
    # kind: Spec(durable, when it is written, fields)
    Kind.submitted: Spec(
        True,
        "a job of the run was queued: by the user's submit (a smoke chain's links too), by hand "
        "after a cancel (by=hand, recorded by its start), or held by the supervisor (requeue_of)",
        ("executor", "fingerprint", "after", "requeue_of", "by", "pid", "host", "pid_start")
        + ("smoke_run", "smoke_job_id", "smoke_of", "smoke_part", "smoke_job_ids"),
    ),
    Kind.branched: Spec(
        False,
        "login, a branch's first row: the parent run, the step it branched at, the keys changed",
        ("parent", "parent_fingerprint", "parent_name", "step", "changed"),
    ),
    Kind.started: Spec(
        True,
        "attempt, once every rank joined: an attempt begins (its number counts these rows)",
        ("world_size", "hosts", "pids", "executor"),
    ),
    Kind.attempt_ended: Spec(
        True,
        "how an attempt ended (`class`): by its supervisor, by the next start or a cancel closing "
        "one left open (closed_by), by the time-limit restart (at)",
        ("class", "exit_code", "step", "closed_by", "at", "before_started", "failed_nodes")
        + ("supervisor_error",),
    ),
    Kind.stopped: Spec(
        True,
        "the run stops without a restart (`class`, `error`): a budget spent, no nodes, diverged, "
        "no readable checkpoint, a failed supervisor fallback",
        ("class", "error", "step"),
    ),
    Kind.finished: Spec(
        True,
        "attempt: train.max_steps reached and saved (on_signal: a stop signal came in that step)",
        ("step", "on_signal"),
    ),
    Kind.paused: Spec(
        False, "attempt: train.pause_at_step reached; the next job resumes", ("step",)
    ),
    Kind.failed: Spec(
        True,
        "any rank that saw an error (a crash, a hang; its phase and traceback); in the run tier "
        "when the start cannot claim the run, or the final checkpoint was not saved",
        ("class", "error", "step", "phase", "traceback", "host", "step_nodes", "arrived_at"),
    ),
    Kind.signal: Spec(
        True,
        "attempt: the ranks agreed to stop on a signal (SIGUSR2: the time limit), before the save",
        ("signal", "step", "received_at", "before_save"),
    ),
    Kind.requeued: Spec(
        True,
        "the run's next job exists (how: requeue, same id, or resubmit); `at`: the time limit or "
        "preemption that made it outside the supervisor's normal path",
        ("reason", "excluded", "exclusions_dropped", "new_job_id", "how", "at"),
    ),
    Kind.resubmitting: Spec(
        False,
        "supervisor: about to sbatch the next job (why, nodes excluded)",
        ("reason", "excluded"),
    ),
    Kind.release_failed: Spec(
        False,
        "supervisor: the held next job stays held after every release",
        ("new_job_id", "error"),
    ),
    Kind.restarted_in_allocation: Spec(
        False,
        "supervisor: the next attempt runs inside this job, on the nodes left and spares",
        ("reason", "left_out", "swapped_in", "step_nodes", "spares_left"),
    ),
    Kind.relaunch_abandoned: Spec(
        False,
        "the job was signalled (class) before the in-allocation relaunch for `reason` started",
        ("class", "reason"),
    ),
    Kind.supervisor_failed: Spec(
        True,
        "batch fallback: the supervisor itself raised",
        ("error", "traceback", "exit_code"),
    ),
    Kind.budget_window: Spec(
        True,
        "a user's submission after a stop starts: budgets count again",
        ("window", "after_class", "after_error", "after_job_id"),
    ),
    Kind.cancelled: Spec(
        True, "login, `slurmtrain cancel`: the jobs scancel'ed, by whom", ("job_ids", "by", "host")
    ),
    Kind.duplicate_refused: Spec(
        True, "a start found another live job training the run and exits untouched", ("owner",)
    ),
    Kind.node_lost: Spec(
        True, "a node the attempt lost: by its supervisor, or by the next start", ("node",)
    ),
    Kind.bad_node: Spec(
        True, "attempt: a node failed the health gate; the job exits", ("node", "reason")
    ),
    Kind.health_ok: Spec(
        False,
        "attempt: every rank passed the health gate",
        ("seconds", "allreduce_gbps", "intra_node_gbps", "inter_node_gbps", "fabric"),
    ),
    Kind.rendezvous_done: Spec(False, "attempt: the ranks' process group is up", ("seconds",)),
    Kind.startup: Spec(
        False,
        "attempt, after the first step: seconds per start-up phase (compute/startup.py)",
        ("phases", "seconds", "process_started_at", "torch_from", "python", "staged_env")
        + ("build_skipped_init",),
    ),
    Kind.deadlines: Spec(
        False,
        "attempt: its phase deadlines and the IO rates behind them (planning/deadlines.py)",
        ("step_s", "startup_s", "io_floor_s", "io_safety", "world_size", "node_count")
        + ("write_mb_per_s", "read_mb_per_s", "write_rate", "read_rate"),
    ),
    Kind.rollback: Spec(
        True,
        "attempt: a diverged step rolled back in-process, skipping the data window",
        ("step", "loss", "reason", "to_step", "path", "skipped_steps", "skipped_samples")
        + ("data_skip", "number", "seconds"),
    ),
    Kind.resume_applied: Spec(
        False,
        "attempt: train.resume=none|step_N applied (the rest moved aside); saves count from here",
        ("resume", "moved", "kept_step"),
    ),
    Kind.checkpoint_saved: Spec(
        True,
        "attempt: a checkpoint was published",
        ("step", "seconds", "total_seconds", "wait_seconds", "bytes", "path", "mode")
        + ("world_size", "rank_bytes", "write_seconds", "data_position"),
    ),
    Kind.checkpoint_failed: Spec(
        False, "attempt: a save failed; earlier ones are intact", ("step", "error", "path")
    ),
    Kind.checkpoint_loaded: Spec(
        False,
        "attempt: resumed from a checkpoint",
        ("step", "seconds", "rank_bytes", "world_size", "path", "world_size_changed")
        + ("skipped_samples",),
    ),
    Kind.checkpoint_skipped: Spec(
        False, "attempt: the resume choice passed a checkpoint over", ("path", "reason")
    ),
    Kind.checkpoint_verified: Spec(
        False,
        "attempt: the ranks verified a checkpoint before loading it",
        ("path", "ok", "reason", "world_size", "files", "bytes", "rank_bytes", "seconds"),
    ),
    Kind.checkpoint_converted: Spec(
        False,
        "attempt: another world size's checkpoint converted (or its cached copy reused)",
        ("step", "path", "seconds", "cached", "from_world_size", "to_world_size"),
    ),
    Kind.checkpoint_unloadable: Spec(
        False,
        "attempt: a checkpoint failed to load; marked, the one before is tried",
        ("step", "path", "error"),
    ),
    Kind.straggler: Spec(
        False,
        "attempt: a rank's compute time per step passed train.straggler_factor x the median",
        ("rank", "node", "factor", "step"),
    ),
    Kind.memory_checked: Spec(
        False,
        "attempt: measured peak memory against the plan",
        ("step", "measured_bytes", "planned_bytes", "ratio", "planned_parts"),
    ),
    Kind.flops_profile: Spec(
        False,
        "attempt: DeepSpeed's flops profile of one step against the model's count",
        ("step", "path", "fwd_flops_per_micro_batch", "flops_per_token_measured")
        + ("flops_per_token_model",),
    ),
    Kind.tracker_failed: Spec(
        False, "attempt: a metrics tracker failed and was dropped", ("tracker", "error")
    ),
}

# Fsynced before record() returns (RunDir.record's default; a writer may pass durable=).
DURABLE_KINDS: frozenset[str] = frozenset(k for k, spec in SPECS.items() if spec.durable)
