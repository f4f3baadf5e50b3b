"""Numbers derived from a config: node range, ranks per node, world size, grad accumulation, dtype.

Pure arithmetic on the schema's types, shared by validation, the planner, the login flow and the
compute side; it imports nothing of the package but the schema and its errors.
"""

from __future__ import annotations

import re
from typing import Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import ClusterKind, Dtype, RootConfig


def node_range(nodes: object) -> tuple[int, int]:
    """`nodes` as (min, max): 4 -> (4, 4); "2-4" -> (2, 4). Raises ConfigError otherwise."""
    text = str(nodes).strip()
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    if isinstance(nodes, bool) or not match:
        raise ConfigError(
            f"nodes={nodes!r}: not a node count; use a positive integer (nodes=4) "
            f"or a range (nodes=2-4)"
        )
    low, high = int(match[1]), int(match[2] or match[1])
    if low < 1 or high < low:
        raise ConfigError(
            f"nodes={nodes!r}: must be >= 1 (and min <= max in a range); e.g. nodes=1"
        )
    return low, high


def tasks_per_node(cfg: RootConfig) -> int:
    """One rank per GPU; on CPUs cluster.cpu_tasks_per_node."""
    gpus = int(cfg.gpus_per_node)
    return gpus if gpus > 0 else int(cfg.cluster.cpu_tasks_per_node)


def restarts_in_allocation(cfg: RootConfig) -> bool:
    """Restarts may happen inside the job's allocation: it holds spares, or `nodes` is a range
    (a failed node's survivors can still run it, smaller, through the universal checkpoint)."""
    low, high = node_range(cfg.nodes)
    spares = int(cfg.faults.spare_nodes)
    return cfg.cluster.kind == ClusterKind.slurm and (spares > 0 or low < high)


def world_size(cfg: RootConfig, nodes: Optional[int] = None) -> int:
    return (nodes or node_range(cfg.nodes)[1]) * tasks_per_node(cfg)


def grad_accumulation(cfg: RootConfig, world: int) -> int:
    """Global batch = micro batch x grad accumulation x data-parallel size; only accumulation moves."""
    micro = int(cfg.train.micro_batch_size)
    per_step = micro * world
    gbs = cfg.train.global_batch_size
    if gbs is None:
        raise ConfigError(
            "train.global_batch_size=None: not resolved; validation.resolve_batch fills it in"
        )
    if gbs % per_step:
        raise ConfigError(
            f"train.global_batch_size={gbs}: not divisible by micro batch x world size "
            f"= {micro} x {world} = {per_step}; use a multiple of {per_step} "
            f"(e.g. train.global_batch_size={per_step * max(1, gbs // per_step)})"
        )
    return gbs // per_step


def resolved_dtype(cfg: RootConfig) -> str:
    """deepspeed.dtype with auto resolved: bf16 on GPUs, fp32 on CPUs."""
    if cfg.deepspeed.dtype == Dtype.auto:
        return "bf16" if int(cfg.gpus_per_node) > 0 else "fp32"
    return str(cfg.deepspeed.dtype)
