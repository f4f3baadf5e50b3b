"""The compute-node entrypoint: one attempt of a run, started by srun (or locally), one process per GPU.

read the run directory -> watchdog -> distributed set-up -> record the attempt (closing a vanished
previous one) -> budgets -> health gate -> Trainer -> exit code for the batch-shell supervisor.
`python -m slurmtrain.compute.attempt RUN_DIR` is what the batch script runs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Optional

from slurmtrain.common import errors, events, ledger, provenance, windows
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.slurm_hostlist import expand_hostlist
from slurmtrain.compute import deepspeed_compat, io_count, node_config, quick_exit, startup
from slurmtrain.compute.context import Attempt, RankContext, relaunch_count, restart_count
from slurmtrain.compute.distributed import (
    Placement,
    broadcast,
    collective_timeout_s,
    export,
    placement,
    rank_device,
    wait_for_store,
)
from slurmtrain.compute.faults import inject, owner, signals
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.compute.trainer import Trainer
from slurmtrain.planning import deadlines


def _quiet_environment(cpu: bool) -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    if cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _close_previous_attempt(run: RunDir, attempt: Attempt) -> None:
    """An attempt that ended without its supervisor (Slurm requeued the job itself after a
    preemption or a node failure, or the batch host died) is closed here, with the nodes lost.
    Reads the previous start's rank rows only (its errors say why it ended)."""
    prev = ledger.unended_attempt(attempt.rows)
    if prev is None:
        return
    prev_rows = run.attempt_events(*ledger.attempt_key(prev), run_rows=attempt.rows)
    cls = ledger.vanished_class(prev_rows, prev.attempt)

    def close(row: events.Row) -> None:  # placed in the attempt it closes
        attempt.rows.append(
            run.record(row, job_id=prev.job_id, attempt=prev.attempt, nodes=prev.nodes)
        )

    close(events.AttemptEnded(cls=cls, closed_by=attempt.number))
    lost = sorted(set(prev.nodes) - set(attempt.nodes))
    node_failure = cls == FailureClass.node_failure
    if node_failure and not lost:  # the same names came back: ask Slurm who died
        from slurmtrain.common.slurm_cmd import down_nodes

        lost = down_nodes(list(prev.nodes))
    for node in lost if node_failure else []:
        close(events.NodeLost(node=node))


def _last_error(run: RunDir, rows: events.Rows, number: int) -> Optional[str]:
    """The last error of the run up to the start before attempt `number` (its rank rows too)."""
    prev = ledger.started_row(rows, number - 1)
    since = run.attempt_events(*ledger.attempt_key(prev), run_rows=rows) if prev else rows
    return ledger.last_error(since)


def _healthy(
    cfg: RootConfig, run: RunDir, where: Placement, attempt: Attempt, injector: Injector
) -> bool:
    """The health gate on every rank; bad nodes go to the bad-node ledger, the job exits."""

    from slurmtrain.common.jsonl import append_jsonl
    from slurmtrain.compute.faults import health

    t0 = time.time()
    device = rank_device(cfg.gpus_per_node, os.environ, where.local_rank)
    checks = health.node_checks(run.path, cfg, injector.fails_storage(where.node))
    mine = health.check_rank(
        where.node, where.rank, device, cfg.gpus_per_node, injector.fails_health(where.node), checks
    )
    verdict = health.gate(mine, where.world_size, cfg.faults.health_slow_factor)
    if not verdict.bad:
        figures: health.Figures = verdict.figures
        ok = events.HealthOk(
            seconds=time.time() - t0,
            allreduce_gbps=figures.get("allreduce_gbps"),
            intra_node_gbps=figures.get("intra_node_gbps"),
            inter_node_gbps=figures.get("inter_node_gbps"),
            fabric=figures.get("fabric"),
        )
        attempt.record(ok)
        return True
    if where.rank == 0:
        for bad in verdict.bad:  # the bad-node file's rows (not the ledger's)
            append_jsonl(run.bad_nodes, {**bad, "time": time.time(), "attempt": attempt.number})
            attempt.record(events.BadNode(node=bad["node"], reason=bad["reason"]))
            print(
                f"slurmtrain: node {bad['node']} failed the health gate: {bad['reason']}",
                file=sys.stderr,
            )
    return False


def _startup_hang(
    run: RunDir, where: Placement, watchdog: Watchdog, why: str, arrived_at: Optional[float]
) -> None:
    """A hang before the attempt has a number: its row names job id and restart count. A rank
    stuck in the rendezvous is waiting for the ranks that never joined: its row names its host,
    the step's nodes and when it joined (`arrived_at`, None: it never got there), not a `node` to
    blame (every healthy rank writes one); the supervisor blames the step's nodes none of whose
    ranks had joined when the first rank gave up (batch/supervise.py never_joined)."""
    waiting = watchdog.current == deadlines.RENDEZVOUS
    step_nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    late = " (waiting for ranks to join)" if arrived_at is not None else " (before joining)"
    hang = events.Failed(
        cls=FailureClass.hang,
        error=why + (late if waiting else ""),
        host=where.node,
        phase=watchdog.current,
        step_nodes=tuple(expand_hostlist(step_nodes)) if waiting and step_nodes else (),
        arrived_at=arrived_at if waiting else None,
    )
    run.record_rank(
        hang,
        job_id=where.job_id,
        restart=restart_count(),
        relaunch=relaunch_count(),
        on_node=where.node,
        nodes=[where.node],
        rank=where.rank,
        node=None if waiting else where.node,  # the node to blame, if any
    )


def run(run_dir: str, master_port: Optional[int] = None) -> int:
    """Train this run until it finishes or is told to stop; returns the process exit code."""
    clock = startup.StartupClock()  # from the process's exec: interpreter and imports count
    clock.mark("launch")
    run = RunDir(Path(run_dir).resolve())
    io_count.install(run.path)  # SLURMTRAIN_COUNT_IO=1: bench/restart_ops.py's counters
    where = placement(os.environ, default_port=master_port or 29500)
    cfg = node_config.load(run, where)  # the shared file read once per node, not per rank
    _quiet_environment(cfg.gpus_per_node == 0)
    flags = signals.SignalFlags().install()
    export(where)
    # The watchdog runs from the first collective on, each phase with its own deadline
    # (planning/deadlines.py): start-up phases here and in the Trainer, then steps and saves.
    dump = run.hang_dump(0, where.node).with_name(
        f"startup.job{where.job_id}.restart{restart_count()}"
        + (f".relaunch{relaunch_count()}" if relaunch_count() else "")
        + f".{where.node}.txt"
    )
    arrival: dict[str, float] = {}  # when this rank joined the rendezvous (wall clock)
    watchdog = Watchdog(
        cfg.faults.startup_timeout_s,
        dump,
        lambda why: _startup_hang(run, where, watchdog, why, arrival.get("at")),
        errors.EXIT_HANG,
        phase=deadlines.RENDEZVOUS,
        rank=where.rank,  # one block of its node's file
    ).start()
    inject.wedge_before_rendezvous(where.rank, run.path, bool(cfg.faults.allow_inject))
    try:
        return _run(run, cfg, where, flags, watchdog, arrival, clock)
    finally:
        watchdog.stop()
        node_config.forget(run, where)  # a start that never met leaves no copy behind


def _run(
    run: RunDir,
    cfg: RootConfig,
    where: Placement,
    flags: signals.SignalFlags,
    watchdog: Watchdog,
    arrival: dict[str, float],
    clock: startup.StartupClock,
) -> int:
    started = time.time()
    with deepspeed_compat.deepspeed_without_mlflow(cfg):  # the imports phase: _join uses them
        import deepspeed  # noqa: F401
    import torch.distributed as dist

    from slurmtrain.compute.checkpoint import safe_load

    safe_load.enforce()  # every checkpoint load weights-only, DeepSpeed's own too (safe_load.py)
    io_count.count_collectives()
    clock.mark("imports")
    startup.say_staged(where.rank, where.node)

    # Every start-up failure (device, rendezvous, claim) is recorded: no attempt number yet, so
    # its row names the job id and restart count, and the node.
    try:
        _join(cfg, where, watchdog, arrival)
        node_config.forget(run, where)  # every rank of the node read the copy before joining
        rendezvous_s = time.time() - started
        gathered: list[tuple[str, int]] = [("", 0)] * where.world_size
        dist.all_gather_object(gathered, (where.node, os.getpid()))
        begun = _start(run, cfg, where, gathered)
        if not isinstance(begun, Attempt):  # another live job trains this run, or Slurm cannot say
            dist.destroy_process_group()
            return begun
        attempt = begun
    except Exception as err:  # every rank that fails writes a row: the rank tier
        _start_failed(run, where, err)
        raise
    attempt.record(events.RendezvousDone(seconds=rendezvous_s))
    clock.mark("rendezvous")
    attempt.clock = clock if where.rank == 0 else None
    if where.rank == 0:
        provenance.write(
            run.provenance,
            f"attempt_{attempt.number}",
            extra={"nodes": attempt.nodes, "world_size": where.world_size},
        )
    stop = broadcast(ledger.over_budget(attempt.rows, cfg.faults) if where.rank == 0 else None)
    if stop is not None:  # Slurm restarted us (preemption, node failure) past a budget
        error = ledger.stop_detail(attempt.rows, cfg.faults, stop) or (
            _last_error(run, attempt.rows, attempt.number) if where.rank == 0 else None
        )
        attempt.record(events.Stopped(cls=stop, error=error or f"{stop} budget exhausted"))
        dist.destroy_process_group()
        return 0
    code = _train(run, cfg, where, attempt, flags, watchdog, clock)
    dist.barrier()
    dist.destroy_process_group()
    return code


def _join(cfg: RootConfig, where: Placement, watchdog: Watchdog, arrival: dict[str, float]) -> None:
    """This rank's device, then the rendezvous (its deadline counts from here, imports done; the
    row of a hang says when this rank arrived)."""
    import deepspeed
    import torch

    cpu = cfg.gpus_per_node == 0
    if cpu:
        # DeepSpeed's shared-memory all-reduce JIT-compiles for ~50 s on first use; gloo is enough.
        deepspeed_compat.no_shm_comm()
    else:
        torch.cuda.set_device(rank_device(cfg.gpus_per_node, os.environ, where.local_rank))
    arrival["at"] = time.time()
    watchdog.phase(deadlines.RENDEZVOUS, cfg.faults.startup_timeout_s, "joining the rendezvous")
    wait_for_store(where, cfg.faults.startup_timeout_s)  # no fixed back-off (distributed.py)
    deepspeed.init_distributed(
        dist_backend="gloo" if cpu else "nccl",
        verbose=False,
        timeout=timedelta(seconds=collective_timeout_s(cfg.faults)),  # the rule: distributed.py
    )


def _start_failed(run: RunDir, where: Placement, err: Exception) -> None:
    """A start-up failure (device, rendezvous, claim), before the attempt has a number: its row
    names the job id and restart count, and the node."""
    run.record_rank(
        events.Failed(
            cls=FailureClass.crash, error=f"{type(err).__name__}: {err}", phase="start-up"
        ),
        job_id=where.job_id,
        restart=restart_count(),
        relaunch=relaunch_count(),
        on_node=where.node,
        nodes=[where.node],
        rank=where.rank,
    )


def _start(
    run: RunDir, cfg: RootConfig, where: Placement, gathered: list[tuple[str, int]]
) -> Attempt | int:
    """Every rank: claim the run under its lock (rank 0), close a vanished previous attempt, open
    a budget window after a stop, and record `Started`: the attempt, or the exit code of a job
    that must not train the run."""
    allowed = bool(cfg.faults.allow_inject)  # SLURMTRAIN_INJECT only where the run opted in
    nodes = sorted({node for node, _ in gathered})
    rows: events.Rows = []  # rank 0: the run tier, read once (under the lock)
    with contextlib.ExitStack() as lock:
        claim: Optional[int] = broadcast(
            owner.claim(run, where, lock, rows) if where.rank == 0 else None
        )
        if claim is not None:
            return claim
        number = sum(isinstance(e, events.Started) for e in rows) + 1
        attempt = Attempt(run, where, nodes, broadcast(number if where.rank == 0 else 0), rows)
        Injector(
            where.rank, attempt=attempt.number, name=str(cfg.name), allowed=allowed
        ).before_start()
        if where.rank == 0:
            _close_previous_attempt(run, attempt)
            # the user's resubmission after a stop: budgets count again from here
            windows.open_window(run, attempt.rows, where.job_id)
        attempt.record(
            events.Started(
                world_size=where.world_size,
                hosts=tuple(n for n, _ in gathered),
                pids=tuple(p for _, p in gathered),
                restart=restart_count(),
                relaunch=relaunch_count(),
                executor="slurm" if owner.under_slurm() else "local",
            )
        )
    return attempt


def _train(
    run: RunDir,
    cfg: RootConfig,
    where: Placement,
    attempt: Attempt,
    flags: signals.SignalFlags,
    watchdog: Watchdog,
    clock: startup.StartupClock,
) -> int:
    """The health gate, then the Trainer; a failing rank records its error, then re-raises."""
    import torch

    allowed = bool(cfg.faults.allow_inject)
    injector = Injector(where.rank, attempt=attempt.number, name=str(cfg.name), allowed=allowed)
    watchdog.stacks = run.hang_dump(attempt.number, where.node)
    watchdog.on_hang = lambda why: attempt.record_any(
        events.Failed(cls=FailureClass.hang, error=why, phase=watchdog.current)
    )
    try:
        watchdog.phase(deadlines.HEALTH, cfg.faults.startup_timeout_s)
        if cfg.faults.health_check and not _healthy(cfg, run, where, attempt, injector):
            return errors.EXIT_BAD_NODE
        clock.mark("health")
        device = (
            torch.device("cpu")
            if cfg.gpus_per_node == 0
            else torch.device("cuda", torch.cuda.current_device())
        )  # with one GPU bound per task it is cuda:0 whatever the local rank
        ctx = RankContext(where, device, attempt.record, watchdog)
        code = Trainer(cfg, run, ctx, attempt, flags, injector).fit()
    except Exception as err:  # the failing rank records its error and class, then re-raises
        error, trace = f"{type(err).__name__}: {err}", traceback.format_exc()
        failed = events.Failed(
            cls=FailureClass.crash, error=error, step=attempt.step, traceback=trace[-4000:]
        )
        attempt.record_any(failed)
        if ledger.is_peer_error([failed]):
            watchdog.dump_after_peer_failure(f"peer failure: {error}\n{trace}\n")
        raise
    finally:
        watchdog.stop()
        gc.collect()
    return code


def main() -> None:
    quick_exit.arm()  # first: the atexit handlers torch, DeepSpeed, trackers register run before
    if len(sys.argv) != 2:
        print("usage: python -m slurmtrain.compute.attempt RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    code = run(sys.argv[1])
    quick_exit.leave(code)  # no module teardown: seconds per rank before the next attempt


if __name__ == "__main__":
    main()
