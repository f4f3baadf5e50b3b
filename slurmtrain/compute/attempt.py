"""The compute-node entrypoint: what srun (or submitit's local executor) starts, one process per GPU.

read the run directory -> distributed set-up -> record the attempt -> pick the newest valid
checkpoint -> build the DeepSpeed engine -> train -> checkpoint -> record the outcome -> tear down.
`python -m slurmtrain.compute.attempt RUN_DIR` is the same code the submitit path calls.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common import ledger as faults
from slurmtrain.common import errors, provenance
from slurmtrain.compute.faults import signals
from slurmtrain.common.schema import load_run_config
from slurmtrain.compute.distributed import Placement, export, placement, rank_device
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.common.rundir import RunDir
from slurmtrain.compute.faults.watchdog import Watchdog


def _quiet_environment(cpu: bool) -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def _set_rng(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    if state:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])


class Attempt:
    """One start of the job on the compute nodes: placement, attempt number, ledger writes."""

    def __init__(self, run: RunDir, where: Placement, nodes: list[str], number: int) -> None:
        self.run, self.where, self.nodes, self.number = run, where, nodes, number

    step: Optional[int] = None  # the step being trained, for failure records

    def record(self, event: str, **fields: Any) -> None:
        """Rank 0 writes the attempt's events (one copy, not one per rank)."""
        if self.where.rank == 0:
            self.record_any(event, **fields)

    def record_any(self, event: str, **fields: Any) -> None:
        """Any rank: failures are recorded by the rank that saw them."""
        fields.setdefault("rank", self.where.rank)
        self.run.record(event, job_id=self.where.job_id, attempt=self.number, nodes=self.nodes,
                        **fields)


def _broadcast(obj: Any) -> Any:
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _close_previous_attempt(run: RunDir, attempt: Attempt) -> None:
    """An attempt that ended without its supervisor (Slurm requeued the job itself after a
    preemption or a node failure, or the batch host died) is closed here, with the nodes lost."""
    events = run.events()
    prev = faults.unended_attempt(events)
    if prev is None:
        return
    cls = faults.vanished_class(events, prev["attempt"])
    record = dict(job_id=prev.get("job_id"), attempt=prev["attempt"], nodes=prev.get("nodes", []))
    run.record("attempt_ended", **record, **{"class": cls, "closed_by": attempt.number})
    lost = sorted(set(prev.get("nodes", [])) - set(attempt.nodes))
    if cls == faults.NODE_FAILURE and not lost:  # the same names came back: ask Slurm who died
        from slurmtrain.batch.supervise import _down_nodes

        lost = _down_nodes(prev.get("nodes", []))
    for node in lost if cls == faults.NODE_FAILURE else []:
        run.record("node_lost", **record, node=node)


def _healthy(cfg: Any, run: RunDir, where: Placement, attempt: Attempt, injector: Any) -> bool:
    """The health gate on every rank; bad nodes go to the bad-node ledger, the job exits."""
    import torch

    from slurmtrain.compute.faults import health
    from slurmtrain.common.rundir import append_jsonl

    t0 = time.time()
    device = rank_device(cfg.gpus_per_node, os.environ, where.local_rank)
    mine = health.check_rank(where.node, where.rank, device, cfg.gpus_per_node,
                             injector.fails_health(where.node))
    bad = health.gate(mine, where.world_size, cfg.faults.health_slow_factor)
    if not bad:
        attempt.record("health_ok", seconds=time.time() - t0)
        return True
    if where.rank == 0:
        for row in bad:
            append_jsonl(run.path / "bad_nodes.jsonl", {**row, "time": time.time(),
                                                        "attempt": attempt.number})
            attempt.record("bad_node", node=row["node"], reason=row["reason"])
            print(f"slurmtrain: node {row['node']} failed the health gate: {row['reason']}",
                  file=sys.stderr)
    return False


def run(run_dir: str, master_port: Optional[int] = None) -> int:
    """Train this run until it finishes or is told to stop; returns the process exit code."""
    run = RunDir(Path(run_dir).resolve())
    cfg = load_run_config(str(run.config))
    cpu = cfg.gpus_per_node == 0
    _quiet_environment(cpu)
    flags = signals.SignalFlags().install()
    started = time.time()
    where = placement(os.environ, default_port=master_port or 29500)
    export(where)

    import deepspeed
    import torch
    import torch.distributed as dist

    if cpu:
        # DeepSpeed's shared-memory all-reduce JIT-compiles for ~50 s on first use; gloo is enough.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    else:
        torch.cuda.set_device(rank_device(cfg.gpus_per_node, os.environ, where.local_rank))
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl", verbose=False,
                               timeout=timedelta(seconds=cfg.faults.collective_timeout_s))
    rendezvous_s = time.time() - started
    gathered: list[Any] = [None] * where.world_size
    dist.all_gather_object(gathered, (where.node, os.getpid()))
    nodes = sorted({node for node, _ in gathered})
    attempt = Attempt(run, where, nodes, _broadcast(run.attempts() + 1 if where.rank == 0 else 0))
    if where.rank == 0:
        _close_previous_attempt(run, attempt)
    attempt.record("started", world_size=where.world_size, hosts=[n for n, _ in gathered],
                   pids=[p for _, p in gathered])
    attempt.record("rendezvous_done", seconds=rendezvous_s)
    if where.rank == 0:
        provenance.write(run.provenance, f"attempt_{attempt.number}",
                         extra={"nodes": nodes, "world_size": where.world_size})
    stop = _broadcast(faults.over_budget(run.events(), cfg.faults) if where.rank == 0 else None)
    if stop is not None:  # Slurm restarted us (preemption, node failure) past a budget
        attempt.record("stopped", **{"class": stop, "error": faults.last_error(run.events())
                                     or f"{stop} budget exhausted"})
        dist.destroy_process_group()
        return 0
    injector = Injector(where.rank, attempt=attempt.number, name=str(cfg.name))
    watchdog = Watchdog(cfg.faults.hang_timeout_s,
                        run.path / "hangs" / f"attempt{attempt.number}.rank{where.rank}.txt",
                        lambda why: attempt.record_any("failed", **{"class": faults.HANG,
                                                                    "error": why}),
                        errors.EXIT_HANG).start()
    try:
        if cfg.faults.health_check and not _healthy(cfg, run, where, attempt, injector):
            return errors.EXIT_BAD_NODE
        watchdog.beat("health gate")
        code = _train(cfg, run, where, attempt, flags, injector, watchdog)
    except Exception as err:  # the failing rank records its error and class, then re-raises
        attempt.record_any("failed", **{"class": faults.CRASH, "error": f"{type(err).__name__}: "
                                        f"{err}", "step": attempt.step},
                           traceback=traceback.format_exc()[-4000:])
        raise
    finally:
        watchdog.stop()
        gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return code


def _train(cfg: Any, run: RunDir, where: Placement, attempt: Attempt,
           flags: signals.SignalFlags, injector: Injector, watchdog: Watchdog) -> int:
    import deepspeed
    import torch

    from slurmtrain.compute.checkpoint import format as ckpt
    from slurmtrain.common import ds_config
    from slurmtrain.compute.checkpoint.manager import Checkpointer
    from slurmtrain.compute import data, loop, model
    from slurmtrain.compute.observe.memory import MemoryCheck
    from slurmtrain.compute.observe.metrics import MetricsWriter
    from slurmtrain.compute.observe.perf import Perf

    rank, world = where.rank, where.world_size
    device = rank_device(cfg.gpus_per_node, os.environ, where.local_rank)
    resume = ckpt.find_resumable(run.checkpoints, full=cfg.checkpoint.verify == "checksum") \
        if rank == 0 else None
    resume = _broadcast(resume)
    for path, reason in resume.skipped:
        attempt.record("checkpoint_skipped", path=path, reason=reason)
        if rank == 0:
            print(f"slurmtrain: skipping checkpoint {path}: {reason}", file=sys.stderr)

    config = ds_config.build(cfg, world, profile_dir=str(run.path / "profile"))
    load_dir, same_world = resume.path, True
    if resume.path is not None and int(resume.manifest.get("world_size", world)) != world:
        # Written by another world size: load DeepSpeed's universal form (converted once, cached);
        # the global batch is fixed, grad accumulation adjusted by ds_config; RNG is per rank.
        from slurmtrain.compute.checkpoint import reshape

        load_dir = reshape.for_world(resume, rank, world, attempt.record, cfg.checkpoint.verify)
        config.setdefault("checkpoint", {})["load_universal"] = True
        same_world = False
    memory = MemoryCheck(cfg, device, rank, world, attempt.record)
    memory.start()
    net = model.build(cfg, config)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                           config=config)
    checkpointer = Checkpointer(
        run.checkpoints, rank, world, cfg.checkpoint.verify, async_save=cfg.checkpoint.async_save,
        keep_last=cfg.checkpoint.keep_last, keep_every=cfg.checkpoint.keep_every,
        stop_on_error=cfg.checkpoint.on_save_error == "stop", record=attempt.record,
        hook=injector.after_shard, timeout_s=cfg.checkpoint.publish_timeout_minutes * 60)
    checkpointer.attach(engine)
    start_step = 0
    if resume.path is not None and load_dir is not None:
        t0 = time.time()
        _set_rng(checkpointer.load(engine, load_dir, restore_rng=same_world))
        start_step = int(resume.manifest["step"])
        watchdog.beat("checkpoint load")
        attempt.record("checkpoint_loaded", step=start_step, seconds=time.time() - t0,
                       path=str(load_dir), world_size_changed=not same_world)

    tokens = data.load_tokens(cfg.data.kind, cfg.data.path, cfg.data.max_corpus_bytes)
    sampler = data.Sampler(len(tokens), cfg.data.seq_len, cfg.data.seed)
    metrics = MetricsWriter(run.metrics, rank == 0, attempt.number,
                            run.path / "tensorboard" / f"attempt_{attempt.number}",
                            print_lines=rank == 0)

    def save(step: int) -> None:  # the checkpointer records saved/failed events and prunes
        meta = {"world_size": world, "consumed_samples": step * cfg.train.global_batch_size,
                "zero_stage": cfg.deepspeed.stage, "data_position": {
                    "consumed_samples": step * cfg.train.global_batch_size,
                    "epoch": step * cfg.train.global_batch_size // sampler.num_samples}}
        checkpointer.save(engine, step, meta, _rng_state())

    def on_step(step: int, seconds: float) -> None:
        attempt.step = step
        watchdog.beat(f"step {step}")
        memory.after_step(step)
        injector.after_step(step, seconds)

    state = loop.LoopState(start_step, start_step, time.time())
    pause = cfg.train.pause_at_step if start_step < cfg.train.pause_at_step else None
    try:
        tracker = Perf(engine, cfg, world, rank, device, where.node, attempt.record, run.path)
        outcome = loop.train(engine, cfg, tokens, sampler, state, world, rank, device, metrics,
                             flags, save, tracker, on_step=on_step, stop_at=pause)
    except BaseException:
        checkpointer.abandon()  # an async save already copied may still publish
        raise
    finally:
        memory.stop()
        metrics.close()
    checkpointer.settle()  # async: the last save is published (or failed) on every rank
    final = checkpointer.last
    if (outcome.stop_code == signals.NONE and final is not None and not final.ok
            and final.step == outcome.step):
        # Training reached max_steps but its final state is not on disk: not finished (a stop
        # signal still requeues below: the next attempt resumes from an earlier checkpoint).
        attempt.record("failed", **{"class": faults.CRASH, "step": outcome.step,
                                    "error": f"final checkpoint not saved: {final.error}"})
        code = 1
    elif outcome.stop_code == signals.NONE and outcome.step < cfg.train.max_steps:
        attempt.record("paused", step=outcome.step)  # train.pause_at_step: the next job resumes
        code = 0
    elif outcome.stop_code == signals.NONE:
        attempt.record("finished", step=outcome.step)
        code = 0
    else:
        attempt.record("signal", signal=flags.received, step=outcome.step,
                       received_at=flags.received_at)
        # The batch shell's supervisor restarts a time-limited run, and asks Slurm whether a
        # SIGTERM was a preemption (restart) or a scancel (stop).
        code = errors.EXIT_REQUEUE if outcome.stop_code == signals.TIME_LIMIT else \
            errors.EXIT_TERMINATED
    # ZeRO-3 aborts at interpreter exit in ~7% of runs unless torn down in this order.
    engine.destroy()
    del engine, net
    gc.collect()
    return code


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m slurmtrain.compute.attempt RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
