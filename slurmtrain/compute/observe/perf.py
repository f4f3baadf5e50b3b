"""Where a step's time goes: DeepSpeed's timers, FLOPs and MFU, peak memory, stragglers.

Every log interval each rank sends one small vector (its own time per step, the timer split, its
peak memory, its section clocks: observe/stragglers.py) in one all_gather, and rank 0 turns them
into metrics fields and scores stragglers (faults.stragglers, on by default: the section clocks
never sync the device). A rank's *own* time is its wall time minus the time it waited on peers
in the loop's collectives.

Split per step (seconds, mean over ranks), from DeepSpeed's `wall_clock_breakdown` timers:
    time_forward = fwd                  time_backward = bwd - bwd_allreduce
    time_optimizer = step - optimizer_allgather
    time_comm = bwd_allreduce + optimizer_allgather
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from slurmtrain.common import events
from slurmtrain.common.derived import resolved_dtype
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute import deepspeed_compat
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.compute.observe.metrics import MetricValue
from slurmtrain.compute.observe.stragglers import SECTIONS, Sections, Watch
from slurmtrain.planning import flops

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from slurmtrain.compute.context import RankContext

# DeepSpeed's timer names (deepspeed/utils/timer.py, runtime/zero/stage_1_and_2.py).
FWD, BWD, BWD_REDUCE, STEP, ALLGATHER = "fwd", "bwd", "bwd_allreduce", "step", "optimizer_allgather"
_SUMMED = (FWD, BWD, BWD_REDUCE, STEP, ALLGATHER)
# The vector each rank contributes to the interval's all_gather (then its section clocks).
_OWN, _FWD, _BWD, _OPT, _COMM, _MEM = range(6)
_SECTIONS = 6


class StepTimers:
    """Sums DeepSpeed's timers per interval and keeps DeepSpeed from printing them every step.

    With `wall_clock_breakdown` (or the FLOPs profiler) on, the engine and the ZeRO optimizer call
    `timers.log(names)` after every step, which prints a line on rank 0 and resets the timers;
    DeepSpeed has no switch for the print. `log` is replaced on this engine's timer group
    (deepspeed_compat.replace_timer_log) by one that adds the elapsed times to our sums and resets
    the same timers, so DeepSpeed's own reads (the FLOPs profiler's latencies) see what they always
    saw.
    """

    def __init__(self, engine: DeepSpeedEngine) -> None:
        self.enabled = bool(engine.wall_clock_breakdown())
        self.group = engine.timers
        self.ms: dict[str, float] = defaultdict(float)
        deepspeed_compat.replace_timer_log(self.group, self._collect)

    def _collect(
        self,
        names: Iterable[str],
        normalizer: float = 1.0,
        reset: bool = True,
        memory_breakdown: bool = False,
        ranks: Optional[list[int]] = None,
    ) -> None:
        for name in names:
            timer = self.group.timers.get(name)
            if timer is None:
                continue
            if name in _SUMMED:
                self.ms[name] += timer.elapsed(reset=reset) / normalizer
            elif reset:
                timer.reset()

    def take(self, steps: int) -> tuple[float, float, float, float]:
        """(forward, backward, optimizer, comm) seconds per step since the last call."""
        ms, self.ms = self.ms, defaultdict(float)
        per = 1e-3 / max(steps, 1)
        comm = ms[BWD_REDUCE] + ms[ALLGATHER]
        return (
            ms[FWD] * per,
            (ms[BWD] - ms[BWD_REDUCE]) * per,
            (ms[STEP] - ms[ALLGATHER]) * per,
            comm * per,
        )


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated GPU memory; on CPU the process's peak RSS (ru_maxrss: KiB on Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _section_fields(rows: list[list[float]]) -> dict[str, MetricValue]:
    """The median rank's seconds per micro step in each section (`section_forward_s`, ...)."""
    columns = zip(*rows)  # the sections, then the scored time (not a section: left out by zip)
    return {f"section_{n}_s": statistics.median(c) for n, c in zip(SECTIONS, columns)}


def _straggler_watch(
    cfg: RootConfig, ctx: RankContext, hosts: list[str], run_path: Path
) -> tuple[Optional[Sections], Optional[Watch]]:
    """This rank's section clock (also when an injected slowdown needs it) and rank 0's scoring;
    None without faults.stragglers."""
    injector = Injector(ctx.rank, name=str(cfg.name), allowed=bool(cfg.faults.allow_inject))
    slow = injector.slowdown(ctx.node)
    on = bool(cfg.faults.stragglers)
    sections = Sections(ctx.device, slow) if on or slow > 1 else None
    if not on or ctx.rank != 0:
        return sections, None
    return sections, Watch(cfg, hosts, ctx.record, RunDir(run_path).bad_nodes)


class Perf:
    """Per-rank clocks for one attempt and the interval report (one all_gather per log interval)."""

    def __init__(
        self,
        engine: DeepSpeedEngine,
        cfg: RootConfig,
        ctx: RankContext,
        run_path: Path,
    ) -> None:
        self.engine, self.world, self.rank, self.device = engine, ctx.world, ctx.rank, ctx.device
        self.record, self.run_path = ctx.record, run_path  # record: the ledger (writes on rank 0)
        self.hosts: list[str] = [""] * self.world  # each rank's node, for straggler events
        dist.all_gather_object(self.hosts, ctx.node)
        self.sections, self.watch = _straggler_watch(cfg, ctx, self.hosts, run_path)
        self.watching = bool(cfg.faults.stragglers)
        self.profile_step = int(cfg.train.flops_profile_step)
        assert cfg.train.global_batch_size is not None  # resolved before the job started
        self.micro_tokens = cfg.train.micro_batch_size * cfg.data.seq_len
        self.tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
        # Model FLOPs (no recompute): MFU must not reward activation checkpointing.
        self.flops_per_token = flops.flops_per_token(cfg.model, cfg.data.seq_len)
        self.device_name = (
            torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None
        )
        self.dtype, self.peak_tflops = resolved_dtype(cfg), cfg.peak_tflops
        self.timers = StepTimers(engine)
        self.extra: dict[str, float] = {}  # one-off fields for the next row (the measured FLOPs)
        self.steps = 0
        self.profiled = False  # this interval ran the FLOPs profiler (slow hooks on rank 0 only)
        self.waited = self.saving_s = 0.0
        self.wall_mark = self.own_mark = time.perf_counter()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Time inside a collective: waiting on slower ranks is not this rank's own time."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - t0

    @contextmanager
    def saving(self) -> Iterator[None]:
        """A checkpoint's blocking time: in the ledger (goodput), not in step time or throughput."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.saving_s += time.perf_counter() - t0

    def step_done(self, step: int) -> None:
        self.steps += 1
        if step == self.profile_step:
            self.profiled = True
            if self.rank == 0:
                self._flops_profiled(step)

    def interval(self, step: int, max_steps: int) -> dict[str, MetricValue]:
        """The metrics fields of the steps since the last call (a collective: all ranks call it)."""
        now = time.perf_counter()
        steps = max(self.steps, 1)
        fwd, bwd, opt, comm = self.timers.take(steps)
        own = (now - self.own_mark - self.waited - self.saving_s) / steps
        if self.timers.enabled:
            own -= comm
        clocks = self.sections.take() if self.sections is not None else []
        clocks = clocks if self.watching else []  # the same vector length on every rank
        mine = torch.tensor(
            [own, fwd, bwd, opt, comm, peak_memory_bytes(self.device), *clocks],
            dtype=torch.float64,
            device=self.device,
        )
        rows = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(rows, mine)
        world = torch.stack(rows).cpu().tolist()
        train_s = max(now - self.wall_mark - self.saving_s, 1e-9)
        self.steps, self.waited, self.saving_s = 0, 0.0, 0.0
        # Waiting in the all_gather is no rank's own time; it is in the wall clock.
        self.wall_mark, self.own_mark = now, time.perf_counter()

        tps = self.tokens_per_step * steps / train_s
        column = [list(col) for col in zip(*world)]
        timed = self.timers.enabled
        fields: dict[str, MetricValue] = {
            "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps / self.world,
            "tflops_per_gpu": flops.tflops_per_gpu(tps / self.world, self.flops_per_token),
            "mfu": flops.mfu(
                tps / self.world,
                self.flops_per_token,
                device_name=self.device_name,
                dtype=self.dtype,
                peak_tflops=self.peak_tflops,
            ),
            "step_time": train_s / steps,
            "time_forward": _mean(column[_FWD]) if timed else None,
            "time_backward": _mean(column[_BWD]) if timed else None,
            "time_optimizer": _mean(column[_OPT]) if timed else None,
            "time_comm": _mean(column[_COMM]) if timed else None,
            "compute_time_per_rank": column[_OWN],
            "peak_mem_bytes": [int(m) for m in column[_MEM]],
            "peak_mem_bytes_max": int(max(column[_MEM])),
            "eta_s": (max_steps - step) * train_s / steps,
        }
        fields.update(self.extra)
        if clocks:
            fields.update(_section_fields([row[_SECTIONS:] for row in world]))
            if self.watch is not None and not self.profiled:  # the profiler's hooks: rank 0 slow
                fields.update(self.watch.window(step, [row[_SECTIONS:] for row in world]))
        self.extra, self.profiled = {}, False
        return fields

    def _flops_profiled(self, step: int) -> None:
        """DeepSpeed's profiler counted one micro batch's forward at this step; x3 for training."""
        fwd = getattr(getattr(self.engine, "flops_profiler", None), "flops", None)
        if not fwd:
            return
        measured = 3.0 * fwd / self.micro_tokens
        path = RunDir(self.run_path).profile / f"flops_step{step}.txt"
        self.record(
            events.FlopsProfile(
                step=step,
                path=str(path),
                fwd_flops_per_micro_batch=fwd,
                flops_per_token_measured=measured,
                flops_per_token_model=self.flops_per_token,
            )
        )
        self.extra = {"flops_per_token_measured": measured}
