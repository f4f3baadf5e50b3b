"""The training loop: read it top to bottom.

One step = `grad_accumulation` micro steps of the deterministic sampler, then one all-reduce that
carries the loss and every rank's stop/save flags, so all ranks decide together at the step boundary.
Every log interval one all_gather (observe/perf.py) adds throughput, FLOPs, the timer split, memory
and stragglers to the metrics row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from slurmtrain.compute.data import Sampler, batch
from slurmtrain.compute.faults.signals import NONE, SignalFlags
from slurmtrain.compute.model import loss_fn
from slurmtrain.compute.observe.metrics import MetricsWriter
from slurmtrain.compute.observe.perf import Perf


@dataclass
class LoopState:
    step: int  # completed optimizer steps
    last_save_step: int
    last_save_time: float


@dataclass
class Outcome:
    step: int
    stop_code: int  # signals.NONE when max_steps was reached


def train(
    engine: Any,
    cfg: Any,
    tokens: np.ndarray,
    sampler: Sampler,
    state: LoopState,
    world: int,
    rank: int,
    device: torch.device,
    metrics: MetricsWriter,
    flags: SignalFlags,
    save: Callable[[int], None],
    perf: Perf,
    accum: int,
    on_step: Optional[Callable[[int, float], None]] = None,
    stop_at: Optional[int] = None,
) -> Outcome:
    """Train to max_steps (or to `stop_at`, a pause: saved there, the next job resumes).
    `accum`: micro steps per optimizer step (schema.grad_accumulation for this world size)."""
    end = min(stop_at or cfg.train.max_steps, cfg.train.max_steps)
    micro, gbs, seq = cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.data.seq_len
    every_steps = cfg.checkpoint.interval_steps
    every_seconds = cfg.checkpoint.interval_minutes * 60
    log_every = cfg.train.log_interval

    while state.step < end:
        step_start = time.perf_counter()
        losses = []
        for m in range(accum):
            ids = sampler.indices(state.step, m, rank, micro, world, gbs)
            window = to_device(batch(tokens, ids, seq), device)
            loss = loss_fn(engine, window)
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach().float())
        state.step += 1

        # One collective per step: [loss sum, signal code, time-based save due], built on the
        # device without a host round trip; its one .tolist() is the step's only host sync.
        due = every_seconds > 0 and time.time() - state.last_save_time >= every_seconds
        # (torch.full: a fill kernel taking the value as an argument, no host-to-device copy.)
        shared = torch.stack(
            [torch.stack(losses).mean().to(torch.float64)]
            + [
                torch.full((), float(x), dtype=torch.float64, device=device)
                for x in (flags.code, due)
            ]
        )
        with perf.waiting():  # waiting on slower ranks is not this rank's own time
            dist.all_reduce(shared)
            loss_sum, code_sum, due_sum = shared.tolist()
        loss_value = loss_sum / world
        stop_code = int(code_sum > 0) and _max_code(flags.code, device)
        step_time = time.perf_counter() - step_start
        if on_step is not None:  # fault injection; a slow rank's delay here is its own time, its
            on_step(state.step, step_time)  # peers' wait for it (next step) is DeepSpeed's comm
        perf.step_done(state.step)

        if state.step % log_every == 0 or state.step == cfg.train.max_steps or stop_code:
            # perf.interval is a collective (one all_gather): throughput, FLOPs, timers, memory.
            metrics.log(
                state.step,
                cfg.train.max_steps,
                loss=loss_value,
                lr=engine.get_lr()[0],
                consumed_samples=state.step * gbs,
                **perf.interval(state.step, cfg.train.max_steps),
            )

        finished = state.step >= end
        by_steps = every_steps > 0 and state.step % every_steps == 0
        if finished or stop_code or by_steps or due_sum > 0:
            with perf.saving():
                save(state.step)
            state.last_save_step, state.last_save_time = state.step, time.time()
        if stop_code:
            return Outcome(state.step, stop_code)
    return Outcome(state.step, NONE)


def to_device(window: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch on the rank's device: on CUDA through pinned memory, copied without blocking."""
    host = torch.from_numpy(window)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _max_code(local: int, device: torch.device) -> int:
    """The strongest signal any rank received (TERM outranks USR2)."""
    code = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(code, op=dist.ReduceOp.MAX)
    return int(code.item())
