"""The compute-node entrypoint: what srun (or submitit's local executor) starts, one process per GPU.

read the run directory -> distributed set-up -> record the attempt -> pick the newest valid
checkpoint -> build the DeepSpeed engine -> train -> checkpoint -> record the outcome -> tear down.
`python -m slurmtrain.job RUN_DIR` is the same code the submitit path calls.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Optional

from slurmtrain import faults, provenance
from slurmtrain.config import load_run_config
from slurmtrain.distributed import Placement, export, placement
from slurmtrain.runs import RunDir


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

    def record(self, event: str, **fields: Any) -> None:
        if self.where.rank == 0:
            self.run.record(event, job_id=self.where.job_id, attempt=self.number,
                            nodes=self.nodes, **fields)


def _broadcast(obj: Any) -> Any:
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run(run_dir: str, master_port: Optional[int] = None) -> int:
    """Train this run until it finishes or is told to stop; returns the process exit code."""
    run = RunDir(Path(run_dir).resolve())
    cfg = load_run_config(str(run.config))
    cpu = cfg.gpus_per_node == 0
    _quiet_environment(cpu)
    flags = faults.SignalFlags().install()
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
        torch.cuda.set_device(where.local_rank)
    deepspeed.init_distributed(dist_backend="gloo" if cpu else "nccl", verbose=False)
    rendezvous_s = time.time() - started
    gathered: list[Any] = [None] * where.world_size
    dist.all_gather_object(gathered, (where.node, os.getpid()))
    nodes = sorted({node for node, _ in gathered})
    attempt = Attempt(run, where, nodes, _broadcast(run.attempts() + 1 if where.rank == 0 else 0))
    attempt.record("started", world_size=where.world_size, hosts=[n for n, _ in gathered],
                   pids=[p for _, p in gathered])
    attempt.record("rendezvous_done", seconds=rendezvous_s)
    if where.rank == 0:
        provenance.write(run.provenance, f"attempt_{attempt.number}",
                         extra={"nodes": nodes, "world_size": where.world_size})
    try:
        code = _train(cfg, run, where, attempt, flags)
    except Exception as err:  # record the crash with its class and last line, then re-raise
        attempt.record("failed", **{"class": faults.CRASH, "error": f"{type(err).__name__}: {err}"},
                       traceback=traceback.format_exc()[-4000:])
        raise
    finally:
        gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return code


def _train(cfg: Any, run: RunDir, where: Placement, attempt: Attempt,
           flags: faults.SignalFlags) -> int:
    import deepspeed
    import torch
    import torch.distributed as dist

    from slurmtrain import checkpoint as ckpt
    from slurmtrain import ds_config
    from slurmtrain.inject import Injector
    from slurmtrain.train import data, loop, model
    from slurmtrain.train.metrics import MetricsWriter

    rank, world = where.rank, where.world_size
    device = torch.device("cpu") if cfg.gpus_per_node == 0 else torch.device("cuda", where.local_rank)
    resume = ckpt.find_resumable(run.checkpoints, full=cfg.checkpoint.verify == "checksum") \
        if rank == 0 else None
    resume = _broadcast(resume)
    for path, reason in resume.skipped:
        attempt.record("checkpoint_skipped", path=path, reason=reason)
        if rank == 0:
            print(f"slurmtrain: skipping checkpoint {path}: {reason}", file=sys.stderr)

    config = ds_config.build(cfg, world)
    net = model.build(cfg, config)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                           config=config)
    checkpointer = ckpt.Checkpointer(run.checkpoints, rank, dist.barrier, cfg.checkpoint.verify)
    start_step = 0
    if resume.path is not None:
        t0 = time.time()
        _set_rng(checkpointer.load(engine, resume.path))
        start_step = int(resume.manifest["step"])
        attempt.record("checkpoint_loaded", step=start_step, seconds=time.time() - t0,
                       path=str(resume.path))

    tokens = data.load_tokens(cfg.data.kind, cfg.data.path, cfg.data.max_corpus_bytes)
    sampler = data.Sampler(len(tokens), cfg.data.seq_len, cfg.data.seed)
    metrics = MetricsWriter(run.metrics, rank == 0, attempt.number,
                            run.path / "tensorboard" / f"attempt_{attempt.number}",
                            print_lines=rank == 0)

    def save(step: int) -> None:
        t0 = time.time()
        meta = {"world_size": world, "consumed_samples": step * cfg.train.global_batch_size,
                "zero_stage": cfg.deepspeed.stage, "data_position": {
                    "consumed_samples": step * cfg.train.global_batch_size,
                    "epoch": step * cfg.train.global_batch_size // sampler.num_samples}}
        final = checkpointer.save(engine, step, meta, _rng_state())
        seconds = time.time() - t0
        if rank == 0:
            attempt.record("checkpoint_saved", step=step, seconds=seconds, total_seconds=seconds,
                           bytes=ckpt.dir_bytes(final), path=str(final))
            ckpt.prune(run.checkpoints, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every)

    state = loop.LoopState(start_step, start_step, time.time())
    try:
        outcome = loop.train(engine, cfg, tokens, sampler, state, world, rank, device, metrics,
                             flags, save, on_step=Injector(rank).after_step)
    finally:
        metrics.close()
    if outcome.stop_code == faults.NONE:
        attempt.record("finished", step=outcome.step)
        code = 0
    else:
        attempt.record("signal", signal=flags.received, step=outcome.step)
        code = faults.EXIT_REQUEUE if outcome.stop_code == faults.TIME_LIMIT else 0
    # ZeRO-3 aborts at interpreter exit in ~7% of runs unless torn down in this order.
    engine.destroy()
    del engine, net
    gc.collect()
    return code


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m slurmtrain.job RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
