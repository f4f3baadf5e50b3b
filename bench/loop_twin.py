"""slurmtrain's loop's twin: the same OPT, loss, DeepSpeed config and batches, a plain loop around them.

What bench/loop_overhead.py compares slurmtrain's loop with: everything but the loop is slurmtrain's
own, so the difference is the loop's overhead alone (bench/bare_deepspeed_loop.py is the really bare
loop: transformers' model and loss, a DeepSpeed config of its own). Started once per rank
(RANK/WORLD_SIZE/... set; CPU, gloo): `python bench/loop_twin.py RUN_DIR WARMUP`.
Prints, on rank 0, one JSON line with the tokens/s between step WARMUP and the last step, and the
settings it trained with (the caller checks they are slurmtrain's). With a third argument UNTIL
it trains until that file exists and reports the wall time after each step (bench/loop_overhead.py
--concurrent times it over the very seconds slurmtrain's timed steps ran).

Same as slurmtrain's run in RUN_DIR: the DeepSpeed config dict (ds_config.build, timers included:
`train.timers` decides for both), micro batch, grad accumulation (derived.grad_accumulation), the
training windows and sampler (data.load: the held-out split cut off as ours does), the loss and the
batch copy (loop.to_device). The loop itself is what a DeepSpeed user writes: forward, backward,
step, and one all_reduce of the loss per step for logging.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:
    from slurmtrain.common.ds_config import Section


class Settings(TypedDict):
    """What the bare loop trained with; bench/loop_overhead.py checks they are slurmtrain's."""

    micro_batch: int
    grad_accumulation: int
    global_batch: int
    seq_len: int
    world: int
    wall_clock_breakdown: bool
    zero_stage: int


class Result(TypedDict):
    """Rank 0's JSON line (its readers json.loads it back into this shape)."""

    tokens_per_s: float
    seconds_timed: float
    step_end_times: list[float]  # with UNTIL: time.time() after each step
    intervals_s: list[float]  # CPU runs: seconds of each log interval of the timed steps
    settings: Settings
    peak_mem_bytes: NotRequired[int]  # GPU runs


def zero_stage(config: Section) -> int:
    """The ZeRO stage a DeepSpeed config dict (ds_config.build) asks for."""
    zero = config["zero_optimization"]
    assert isinstance(zero, dict) and isinstance(zero["stage"], int), zero
    return zero["stage"]


def main(run_dir: str, warmup: int, until: str = "") -> None:
    from slurmtrain.common.schema import load_run_config

    cfg = load_run_config(os.path.join(run_dir, "config.yaml"))
    gpu = cfg.gpus_per_node > 0
    if not gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    import torch.distributed as dist

    from slurmtrain.common import ds_config
    from slurmtrain.common.derived import grad_accumulation
    from slurmtrain.compute import data, loop, model

    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo", verbose=False)
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = ds_config.build(cfg, world)  # exactly slurmtrain's (timers: train.timers, both sides)
    net = model.build(cfg, config, device)
    engine, *_ = deepspeed.initialize(
        model=net,
        model_parameters=net.parameters(),
        config=config,
        lr_scheduler=ds_config.lr_scheduler(cfg),  # the schedule slurmtrain trains with
    )
    if engine.wall_clock_breakdown():  # DeepSpeed would print them every step; ours mutes them
        engine.timers.log = lambda *a, **k: None
    loaded = data.load(cfg.data)  # the training windows and sampler slurmtrain trains on
    tokens, sampler = loaded.train, loaded.sampler
    micro, gbs, seq = cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.data.seq_len
    max_steps = cfg.train.max_steps
    assert gbs is not None and max_steps is not None  # resolved before config.yaml was written
    accum = grad_accumulation(cfg, world)
    t_warm = 0.0
    # CPU: the time after every log_interval steps, as slurmtrain's metrics rows are stamped (GPU:
    # not taken, it would need a synchronize the bare loop does not otherwise do).
    every, marks = cfg.train.log_interval, []
    # `until`: run alongside slurmtrain (bench/loop_overhead.py --concurrent) until that file
    # exists; the loss all-reduce then also carries rank 0's "stop" so every rank stops at the
    # same step, and rank 0 stamps the wall time after every step.
    stamps: list[float] = []
    total = 10**9 if until else max_steps
    for step in range(total):
        if step == warmup:
            sync()
            t_warm = time.perf_counter()
        if not gpu and step >= warmup and (step - warmup) % every == 0:
            marks.append(time.perf_counter())
        for m in range(accum):
            ids = sampler.indices(step, m, rank, micro, world, gbs)
            window = loop.to_device(data.batch(tokens, ids, seq), device)
            loss = model.loss_fn(engine, window)
            engine.backward(loss)
            engine.step()
        if not until:
            loss_t = loss.detach().reshape(1)
            dist.all_reduce(loss_t)
            continue
        stop = float(rank == 0 and os.path.exists(until))
        loss_t = torch.stack([loss.detach().float(), torch.tensor(stop, device=device)])
        dist.all_reduce(loss_t)
        stamps.append(time.time())
        if loss_t[1].item() > 0:
            break
    sync()
    elapsed = time.perf_counter() - t_warm
    marks.append(time.perf_counter())
    if rank == 0:
        steps = (len(stamps) if until else max_steps) - warmup
        out: Result = {
            "tokens_per_s": steps * gbs * seq / elapsed,
            "seconds_timed": elapsed,
            "step_end_times": stamps,
            "intervals_s": [b - a for a, b in zip(marks, marks[1:])] if not gpu else [],
            "settings": {
                "micro_batch": micro,
                "grad_accumulation": accum,
                "global_batch": gbs,
                "seq_len": seq,
                "world": world,
                "wall_clock_breakdown": bool(config.get("wall_clock_breakdown")),
                "zero_stage": zero_stage(config),
            },
        }
        if gpu:
            out["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
        print(json.dumps(out), flush=True)
    engine.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
