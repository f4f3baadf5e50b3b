"""The training loop: read it top to bottom.

One step = `accum` micro steps of the deterministic sampler, then one all-reduce carrying the loss,
every rank's stop/save flags and whether its loss or gradient norm is non-finite, so all ranks
decide together at the step boundary: a diverged step (divergence.py) ends the loop before anything
is logged or saved, and the Trainer rolls back. Every log interval one all_gather (observe/perf.py)
adds throughput, FLOPs, timers, memory and stragglers (section clocks timed in _micro_steps, no
device sync) to the metrics row.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from slurmtrain.common.schema import RootConfig
from slurmtrain.compute import evaluate, parallel
from slurmtrain.compute.context import RankContext
from slurmtrain.compute.data import Sampler, Tokens, batch
from slurmtrain.compute.divergence import Divergence, Guard
from slurmtrain.compute.faults.signals import NONE, SignalFlags
from slurmtrain.compute.model import loss_fn
from slurmtrain.compute.observe.metrics import MetricsWriter
from slurmtrain.compute.observe.perf import Perf
from slurmtrain.compute.observe.stragglers import BACKWARD, DATA, FORWARD, OPTIMIZER

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine


@dataclass
class LoopState:
    step: int  # completed optimizer steps
    last_save_step: int
    last_save_time: float


@dataclass
class Outcome:
    step: int
    stop_code: int  # signals.NONE when max_steps was reached
    diverged: Optional[Divergence] = None  # the Trainer rolls back (or stops `diverged`)


@dataclass
class Batches:
    """What the loop trains on: the token windows, the sampler, micro steps per optimizer step
    (grad accumulation for this world size)."""

    tokens: Tokens
    sampler: Sampler
    accum: int


@dataclass
class LoopHooks:
    """What the loop calls out to. `save(step, loss)` returns why it refused (non-finite state: a
    divergence), else None; `on_stop(step, code)` runs when the ranks agree to stop, before their
    save; `poison(step)` (fault injection) makes that step's loss NaN; `stop_at`: a pause (saved
    there, the next job resumes)."""

    save: Callable[[int, float], Optional[str]]
    flags: SignalFlags
    metrics: MetricsWriter
    perf: Perf
    on_step: Optional[Callable[[int, float], None]] = None
    on_stop: Optional[Callable[[int, int], None]] = None
    poison: Optional[Callable[[int], bool]] = None
    evaluator: Optional[evaluate.Evaluator] = None
    guard: Guard = field(default_factory=Guard)
    stop_at: Optional[int] = None


@dataclass(frozen=True)
class _Constants:
    """Config values and rank coordinates the loop reads every step, read once: a config attribute
    costs ~10-80 us, a tiny model's step ~40 ms."""

    fp16: bool  # only a loss-scaled run skips steps on overflow
    world: int
    device: torch.device
    dp_rank: int  # a tensor- or sequence-parallel group reads one batch: the sampler shards
    dp_world: int  # by data-parallel rank and size
    shard: Optional[parallel.SequenceShard]  # an SP rank trains on its slice of each sequence
    max_steps: int
    end: int  # max_steps, or the pause's step (hooks.stop_at)
    micro: int
    seq: int
    gbs: int
    every_steps: int
    every_seconds: float
    log_every: int
    final_save: bool


def _constants(
    engine: DeepSpeedEngine, cfg: RootConfig, ctx: RankContext, hooks: LoopHooks
) -> _Constants:
    dp_rank, dp_world = parallel.data_coords(cfg, ctx.rank, ctx.world)
    max_steps = int(cfg.train.max_steps or 0)
    return _Constants(
        fp16=bool(engine.fp16_enabled()),
        world=ctx.world,
        device=ctx.device,
        dp_rank=dp_rank,
        dp_world=dp_world,
        shard=parallel.sequence_shard(cfg),
        max_steps=max_steps,
        end=min(hooks.stop_at or max_steps, max_steps),
        micro=cfg.train.micro_batch_size,
        seq=cfg.data.seq_len,
        gbs=int(cfg.train.global_batch_size or 0),
        every_steps=int(cfg.checkpoint.interval_steps),
        every_seconds=cfg.checkpoint.interval_minutes * 60,
        log_every=cfg.train.log_interval,
        final_save=bool(cfg.checkpoint.final_save),
    )


def train(
    engine: DeepSpeedEngine,
    cfg: RootConfig,
    data: Batches,
    state: LoopState,
    ctx: RankContext,
    hooks: LoopHooks,
) -> Outcome:
    """Train to max_steps (or to `hooks.stop_at`)."""
    k, perf = _constants(engine, cfg, ctx, hooks), hooks.perf
    while state.step < k.end:
        step_start = time.perf_counter()
        lr = engine.get_lr()[0]  # the rate this step trains with (the scheduler moves after it)
        losses = _micro_steps(engine, data, state.step, k, hooks)
        state.step += 1

        # One collective per step, built on the device; its .tolist() is the step's only host sync.
        due = k.every_seconds > 0 and time.time() - state.last_save_time >= k.every_seconds
        shared = _shared(losses, hooks.flags.code, due, engine, k.device, k.fp16)
        with perf.waiting():  # waiting on slower ranks is not this rank's own time
            dist.all_reduce(shared)
            loss_sum, code_sum, due_sum, bad_sum, skip_sum, floor_sum = shared.tolist()
        loss_value = loss_sum / k.world
        stop_code = int(code_sum > 0) and _max_code(hooks.flags.code, k.device)
        diverged = hooks.guard.judge(state.step, loss_value, bad_sum, skip_sum, floor_sum)
        if diverged is not None:  # nothing of this step is logged or saved; the Trainer rolls back
            return Outcome(state.step, NONE, diverged)
        if hooks.on_step is not None:  # a slow rank's injected delay is its own time here
            hooks.on_step(state.step, time.perf_counter() - step_start)
        perf.step_done(state.step)
        valid, code = evaluate.maybe(
            hooks.evaluator, engine, state.step, hooks.flags, perf, stop_code
        )
        stop_code = stop_code or code
        _log(engine, state.step, k, hooks, loss_value, lr, stop_code, valid)
        refused = _maybe_save(state, k, hooks, loss_value, stop_code, due_sum > 0)
        if refused is not None:
            return refused
        if stop_code:
            return Outcome(state.step, stop_code)
    return Outcome(state.step, NONE)


def _micro_steps(
    engine: DeepSpeedEngine, data: Batches, step: int, k: _Constants, hooks: LoopHooks
) -> list[torch.Tensor]:
    """One optimizer step's `accum` micro steps (forward, backward, engine step); their losses
    as shown (detached, on the device)."""
    losses = []
    clock = (
        hooks.perf.sections
    )  # section clocks for straggler scoring (None: faults.stragglers off)
    for m in range(data.accum):
        if clock is not None:
            clock.start()
        ids = data.sampler.indices(step, m, k.dp_rank, k.micro, k.dp_world, k.gbs)
        window = to_device(batch(data.tokens, ids, k.seq), k.device)
        if clock is not None:
            clock.lap(DATA)
        if k.shard is None:
            loss = shown = loss_fn(engine, window)
        else:  # backward: the slice's share; shown: the whole sequences' mean
            loss, shown = parallel.sequence_loss(engine, window, k.shard)
        if m == 0 and hooks.poison is not None and hooks.poison(step + 1):
            loss, shown = loss * float("nan"), shown * float("nan")
        if clock is not None:
            clock.lap(FORWARD)
        engine.backward(loss)
        if clock is not None:
            clock.lap(BACKWARD)
        engine.step()
        if clock is not None:
            clock.lap(OPTIMIZER)
        losses.append(shown.detach().float())
    return losses


def _log(
    engine: DeepSpeedEngine,
    step: int,
    k: _Constants,
    hooks: LoopHooks,
    loss: float,
    lr: float,
    stop_code: int,
    valid: dict[str, float],
) -> None:
    """The step's metrics row every log interval (and at the end, a stop, a validation), else
    rank 0's own heartbeat line at least every 20 s, from its clock (no collective)."""
    if step % k.log_every == 0 or step == k.max_steps or stop_code or valid:
        hooks.metrics.log(
            step,
            k.max_steps,
            loss=loss,
            lr=lr,
            consumed_samples=step * k.gbs,
            **({"skipped_steps": int(engine.skipped_steps)} if k.fp16 else {}),
            **valid,
            **hooks.perf.interval(step, k.max_steps),  # a collective (one all_gather)
        )
    else:
        hooks.metrics.heartbeat(step, k.max_steps, k.gbs * k.seq, loss=loss, lr=lr)


def _maybe_save(
    state: LoopState, k: _Constants, hooks: LoopHooks, loss: float, stop_code: int, due: bool
) -> Optional[Outcome]:
    """Save when the run ends here, stops, or an interval (steps, or minutes: `due`) is up; the
    Outcome that ends the loop when the save refused (non-finite state: a divergence)."""
    finished = state.step >= k.end and (state.step < k.max_steps or k.final_save)
    by_steps = k.every_steps > 0 and state.step % k.every_steps == 0
    if not (finished or stop_code or by_steps or due):
        return None
    if stop_code and hooks.on_stop is not None:  # before the save: it may outlast grace
        hooks.on_stop(state.step, stop_code)
    with hooks.perf.saving():
        refused = hooks.save(state.step, loss)
    if refused is not None:
        return Outcome(state.step, NONE, Divergence(state.step, loss, refused))
    state.last_save_step, state.last_save_time = state.step, time.time()
    return None


def _shared(
    losses: list[torch.Tensor],
    code: int,
    due: bool,
    engine: DeepSpeedEngine,
    device: torch.device,
    fp16: bool = False,
) -> torch.Tensor:
    """This rank's part of the step's all-reduce, a float64 vector on the device: [mean loss,
    signal code, time-based save due, 1.0 when its loss or DeepSpeed's global gradient norm of
    the step is not finite, 1.0 when the fp16 loss scaler skipped the step, 1.0 when its scale is
    at the minimum]. Built without a host round trip (torch.full: a fill kernel taking the
    value as an argument, no copy), so reading the all-reduced vector is the step's only host
    sync."""
    loss = (losses[0] if len(losses) == 1 else torch.stack(losses).mean()).reshape(1)
    loss = loss.to(torch.float64)
    checked = loss
    norm = engine.get_global_grad_norm()  # None when it computed none; a float or a tensor
    # a negative norm is DeepSpeed's mark of a non-finite one (its group-norm helpers' -1)
    if isinstance(norm, torch.Tensor):
        norm_ = norm.detach().reshape(1).to(device, torch.float64)
        checked = torch.cat([loss, torch.where(norm_ >= 0, norm_, torch.nan)])
    bad = (~torch.isfinite(checked)).any().reshape(1).to(torch.float64)
    if norm is not None and not isinstance(norm, torch.Tensor):
        if not 0 <= float(norm) < math.inf:
            bad = torch.ones_like(bad)
    skipped, floor = _overflow(engine) if fp16 else (False, False)
    host = [torch.full((1,), float(x), dtype=torch.float64, device=device) for x in (code, due)]
    flags = [
        torch.full((1,), float(x), dtype=torch.float64, device=device) for x in (skipped, floor)
    ]
    return torch.cat([loss, *host, bad, *flags])


def _overflow(engine: DeepSpeedEngine) -> tuple[bool, bool]:
    """(the loss scaler skipped this step, its scale is at fp16.min_loss_scale): host values
    DeepSpeed keeps (the overflow check is already all-reduced inside its step)."""
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    at_min = bool(
        scaler is not None
        and getattr(scaler, "dynamic", False)
        and scaler.cur_scale <= getattr(scaler, "min_scale", 0)
    )
    return not engine.was_step_applied(), at_min


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
