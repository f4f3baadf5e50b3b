"""Host memory per node: what a node's ranks really hold in RAM (planning/memory.py's host half).

How slurmtrain builds and saves (compute/model.py, compute/checkpoint/hostpool.py):
- build: ZeRO 0-2 build the model on the GPU in the training dtype, ZeRO-3 under zero.Init: no host
  copy. `model.pretrained_path` loads each rank's copy on the host in the training dtype first
  (`from_pretrained(dtype=...)` then `.to(device)`), whole under ZeRO 0-2; under ZeRO-3
  transformers partitions each tensor as it loads (DeepSpeed's budget: one largest layer a rank).
  Without zero.Init (DeepSpeed's estimator's other case) every rank builds it whole.
- offload: the optimizer (and ZeRO-3 parameter) states DeepSpeed moves to the host, times
  DeepSpeed's additional_buffer_factor (1.5: its estimators' own margin).
- async saves: one pinned host copy of each rank's saved state, reused from save to save (the fp32
  master weights and Adam moments of its partition; the module's weights once without ZeRO):
  planning/deadlines.layout's bytes per node.
- each rank's process: Python, torch and CUDA's host side, NCCL's host buffers (PROCESS_BYTES).
The build is transient (freed before training); offload, pinned copies and processes stay, so a
node needs max(build, offload + pinned) + processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from slurmtrain.planning import deadlines

GiB = 2**30
CPU_BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for offloaded states
# A CUDA rank's resident memory before its tensors: ~1 GiB of libraries and the CUDA context's host
# side, NCCL's host buffers, the data loader. An assumption, not measured here.
PROCESS_BYTES = 2 * GiB


@dataclass(frozen=True)
class HostPlan:
    """Bytes of host memory on one node, by part."""

    build: float  # transient: the model's host copies while it is built or loaded
    offload: float  # offloaded ZeRO states, with DeepSpeed's buffer factor
    pinned: float  # async saves' pinned host copies of the saved state
    process: float  # the ranks' processes themselves

    @property
    def total(self) -> int:
        return int(max(self.build, self.offload + self.pinned) + self.process)

    def parts(self) -> str:
        """'pinned save copies 2.4 + offload 0 + processes 16 GiB' (the plan's host figure)."""
        g = GiB
        text = (
            f"pinned save copies {self.pinned / g:.1f} + offload {self.offload / g:.0f} + "
            f"processes {self.process / g:.0f} GiB"
        )
        return text + (f"; build {self.build / g:.0f} GiB first" if self.build else "")


def host_plan(
    *,
    params: int,
    largest_layer: int,
    stage: int,
    dtype_bytes: int,
    world: int,
    gpus_per_node: int,
    offloaded_per_rank: float,
    zero_init: bool = True,
    pretrained: bool = False,
    async_save: bool = False,
) -> HostPlan:
    """The host plan of one node (`gpus_per_node` ranks); `offloaded_per_rank`: the ZeRO states
    planning/memory.py puts on the host for each rank."""
    ranks, d = gpus_per_node, dtype_bytes
    if stage == 3 and zero_init:
        build = d * largest_layer * ranks if pretrained else 0.0
    elif stage == 3 or pretrained:
        build = float(d * params * ranks)
    else:
        build = 0.0
    pinned = 0.0
    if async_save:
        pinned = deadlines.layout(params, world, ranks, stage, d).save.node
    return HostPlan(
        build=build,
        offload=CPU_BUFFER_FACTOR * offloaded_per_rank * ranks,
        pinned=pinned,
        process=float(PROCESS_BYTES * ranks),
    )


def misfit(host: int, cpu_mem_bytes: Optional[int], parts: str) -> Optional[str]:
    """The clause of a refusal when the node's host memory is short (None: it fits or unknown)."""
    if cpu_mem_bytes is None or host <= cpu_mem_bytes:
        return None
    return f"host/node {host / GiB:.0f} GiB ({parts}) > cluster.cpu_mem_gb={cpu_mem_bytes / GiB:g}"


HOST_FIX = (
    "set cluster.cpu_mem_gb to the node's memory if it has more, add nodes (smaller shards), "
    "or checkpoint.async_save=false (no pinned copies)"
)


def node_memory(
    kind: str, cpu_mem_gb: Optional[float], nodes: int = 1
) -> tuple[Optional[int], str]:
    """One node's host memory known at plan time, and where it is from: cluster.cpu_mem_gb, else
    this machine's RAM for cluster=local on one node (its ranks run here; more nodes are refused
    for that, not for memory), else unknown (None)."""
    if cpu_mem_gb:
        return int(cpu_mem_gb * GiB), f"cluster.cpu_mem_gb={cpu_mem_gb:g}"
    if kind != "local" or nodes != 1:
        return None, ""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # no such sysconf name here: unknown, nothing refused
        return None, ""
    return int(ram), "this machine's RAM"


def size(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1 (MiB up to PiB)."""
    units = ("MiB", "GiB", "TiB", "PiB")
    value, unit = nbytes / 2**20, units[0]
    for unit in units:
        if value < 1024 or unit == units[-1]:
            break
        value /= 1024
    return f"{value:.1f} {unit}"


def cpu_ranks_misfit(
    per_rank: float, activations: float, micro_batch: int, ranks: int, node_mem: Optional[int],
    source: str,
) -> Optional[str]:  # fmt: skip
    """The refusal clause of CPU ranks whose tensors exceed the node's memory (None: they fit, or
    the memory is unknown), with the micro batch that fits: activations grow with it, the rest
    (weights, gradients, optimizer states) does not."""
    if node_mem is None or per_rank * ranks <= node_mem:
        return None
    per_sample = activations / max(1, micro_batch)
    room = node_mem / ranks - (per_rank - activations)
    fits = int(room // per_sample) if per_sample > 0 and room > 0 else 0
    need = (
        f"memory/rank {size(per_rank)} x {ranks} CPU rank{'s' * (ranks > 1)} = "
        f"{size(per_rank * ranks)} > {size(node_mem)} ({source})"
    )
    if fits < 1:  # the weights and states alone do not fit: the micro batch is not the lever
        return f"{need}; use a smaller model, or fewer ranks (cluster.cpu_tasks_per_node)"
    return (
        f"train.micro_batch_size={micro_batch}: {need}; set train.micro_batch_size="
        f"{min(fits, micro_batch - 1)} or less"
    )
