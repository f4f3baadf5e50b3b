"""The planner checked against this run: peak tensor memory up to step N vs the plan.

`train.memory_check_step=N` measures what every rank allocated (GPUs: the caching allocator's
peak; CPUs: the profiler's running sum of CPU allocations). Rank 0 records the largest peak
(`memory_checked`) beside the planner's estimate and warns when the plan was low: an
under-estimate is a job that dies of OOM on a bigger machine.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

import torch

from slurmtrain.common import events
from slurmtrain.common.schema import RootConfig

if TYPE_CHECKING:
    from slurmtrain.compute.context import RankContext

TOLERANCE = 0.25  # a measured peak above the plan by more than this gets a warning


class MemoryCheck:
    """Start before the model is built; `after_step` on every rank; done at step `at`."""

    def __init__(self, cfg: RootConfig, ctx: RankContext) -> None:
        self.cfg, self.device, self.rank, self.world = cfg, ctx.device, ctx.rank, ctx.world
        self.record = ctx.record  # the attempt's ledger write (rank 0 writes)
        self.at = int(cfg.train.memory_check_step)
        self.profiler: Optional[torch.profiler.profile] = None
        self.done = self.at <= 0

    def start(self) -> None:
        if self.done:
            return
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self.profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        )
        self.profiler.__enter__()

    def stop(self) -> None:
        """Ends profiling without a figure (the run stopped before step `at`)."""
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None
        self.done = True

    def after_step(self, step: int) -> None:
        if self.done or step < self.at:
            return
        peak = self._peak()
        self.stop()
        figure = torch.tensor([peak], dtype=torch.float64, device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(figure, op=torch.distributed.ReduceOp.MAX)
        if self.rank == 0:
            self._report(int(figure.item()), step)

    def _peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        assert self.profiler is not None
        self.profiler.__exit__(None, None, None)
        prof, self.profiler = self.profiler, None
        return cpu_peak(prof)

    def _report(self, measured: int, step: int) -> None:
        from slurmtrain.common.derived import tasks_per_node
        from slurmtrain.planning.preflight import memory_plan

        # The nodes this attempt really got (a `nodes=2-4` range may start on any of them).
        plan = memory_plan(self.cfg, max(1, self.world // tasks_per_node(self.cfg)))
        # The caching allocator's figure excludes the CUDA context the plan adds on top.
        planned = plan.total - (plan.overhead if self.device.type == "cuda" else 0)
        ratio = measured / planned if planned else float("nan")
        parts: dict[str, object] = {
            "params": plan.params,
            "grads": plan.grads,
            "optimizer": plan.optimizer,
            "activations": plan.activations,
            "buffers": plan.buffers,
        }
        self.record(
            events.MemoryChecked(
                step=step,
                measured_bytes=measured,
                planned_bytes=planned,
                ratio=round(ratio, 4),
                planned_parts=parts,
            )
        )
        line = (
            f"slurmtrain: memory check at step {step}: measured peak {measured / 2**20:.1f} "
            f"MiB/rank, planned {planned / 2**20:.1f} MiB (ratio {ratio:.2f})"
        )
        if ratio > 1 + TOLERANCE:
            line += "; the planner under-estimates this run: leave headroom when scaling it"
        print(line, file=sys.stderr, flush=True)


def cpu_peak(prof: torch.profiler.profile) -> int:
    """Largest running sum of the CPU allocations and frees the profiler saw (bytes).

    Frees of tensors allocated before profiling started are not reported by PyTorch, so the sum
    counts what was allocated since `start` (before the model existed: nearly everything). The
    raw Kineto records: `prof.events()` folds allocations into the operators that made them.
    """
    cpu = torch.autograd.DeviceType.CPU
    allocations = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == cpu
    )
    current = peak = 0
    for _, nbytes in allocations:
        current += nbytes
        peak = max(peak, current)
    return peak
