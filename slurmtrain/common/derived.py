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


def tensor_parallel(cfg: RootConfig) -> int:
    """parallel.tensor (DeepSpeed AutoTP's degree); 1 for a config written before it existed."""
    section = getattr(cfg, "parallel", None)
    return max(1, int(getattr(section, "tensor", 1) or 1))


def sequence_parallel(cfg: RootConfig) -> int:
    """parallel.sequence (DeepSpeed Ulysses' degree); 1 for a config written before it existed."""
    section = getattr(cfg, "parallel", None)
    return max(1, int(getattr(section, "sequence", 1) or 1))


def model_parallel(cfg: RootConfig) -> int:
    """Ranks that share one batch: TP x SP (a TP group reads one batch, an SP group splits one)."""
    return tensor_parallel(cfg) * sequence_parallel(cfg)


def parallel_text(cfg: RootConfig) -> str:
    """How the world divides, for messages: "tensor-parallel 2", "sequence-parallel 2" or both."""
    tp, sp = tensor_parallel(cfg), sequence_parallel(cfg)
    parts = [f"tensor-parallel {tp}"] * (tp > 1) + [f"sequence-parallel {sp}"] * (sp > 1)
    return " x ".join(parts)


def data_parallel(cfg: RootConfig, world: int) -> int:
    """Data-parallel size: world / (TP x SP) (a TP or SP group reads one batch)."""
    tp, mp = tensor_parallel(cfg), model_parallel(cfg)
    if world % mp:
        key = f"parallel.tensor={tp}" if mp == tp else f"parallel.sequence={mp // tp}"
        raise ConfigError(
            f"{key}: does not divide the world size {world} (world / (tensor x sequence) is the "
            f"data-parallel size); use a divisor of the ranks per node ({tasks_per_node(cfg)})"
        )
    return world // mp


def tp_choices(cfg: RootConfig) -> list[int]:
    """The TP degrees a config could use: divisors of the ranks per node that divide the heads."""
    per_node, heads = tasks_per_node(cfg), int(cfg.model.num_heads)
    return [t for t in range(1, per_node + 1) if per_node % t == 0 and heads % t == 0]


def _fits(gbs: int, world: int, mp: int, micro: int) -> bool:
    """`mp`: the ranks that share a batch (TP x SP)."""
    return world % mp == 0 and gbs % (micro * (world // mp)) == 0


def batch_choices(cfg: RootConfig, world: int, gbs: int) -> str:
    """What would fit `gbs` on `world` ranks: the nearest global batches for this TP and micro
    batch, the TP / micro-batch pairs that divide it (micro up to 2x this one), else node counts."""
    micro, tp, sp = int(cfg.train.micro_batch_size), tensor_parallel(cfg), sequence_parallel(cfg)
    unit = micro * max(1, world // (tp * sp))
    below, above = unit * (gbs // unit), unit * (gbs // unit + 1)
    near = f"train.global_batch_size={above}" if below == 0 else f"{below} or {above}"
    near = near if below == 0 else f"train.global_batch_size={near}"
    pairs = []
    for t in tp_choices(cfg):
        micros = [m for m in range(1, max(2 * micro, 4) + 1) if _fits(gbs, world, t * sp, m)]
        if micros:
            pairs.append(
                f"parallel.tensor={t} with train.micro_batch_size={'|'.join(map(str, micros))}"
            )
    if pairs:
        fit = f"or keep {gbs} with " + "; ".join(pairs)
    else:
        per_node = tasks_per_node(cfg)
        nodes = [
            n
            for n in range(1, 2 * max(1, world // per_node) + 1)
            if _fits(gbs, n * per_node, tp * sp, micro)
        ]
        closest = sorted(nodes, key=lambda n: abs(n * per_node - world))[:2]
        fit = (
            f"no parallel.tensor in {tuple(tp_choices(cfg))} and micro batch up to "
            f"{max(2 * micro, 4)} divides {gbs} on {world} ranks"
            + (
                f"; with parallel.tensor={tp} nodes={' or '.join(map(str, sorted(closest)))} do"
                if closest
                else ""
            )
        )
    return f"nearest that divide: {near}; {fit}"


def grad_accumulation(cfg: RootConfig, world: int) -> int:
    """Global batch = micro batch x grad accumulation x data-parallel size (world / (TP x SP));
    only accumulation moves."""
    micro = int(cfg.train.micro_batch_size)
    dp = data_parallel(cfg, world)
    per_step = micro * dp
    gbs = cfg.train.global_batch_size
    if gbs is None:
        raise ConfigError(
            "train.global_batch_size=None: not resolved; validation.resolve_batch fills it in"
        )
    if gbs % per_step:
        tp, sp = tensor_parallel(cfg), sequence_parallel(cfg)
        size = f"world size {world}"
        if tp * sp > 1:
            keys = [f"parallel.tensor={tp}"] * (tp > 1) + [f"parallel.sequence={sp}"] * (sp > 1)
            size = f"world {world} / " + " x ".join(keys)
        raise ConfigError(
            f"train.global_batch_size={gbs}: not divisible by micro batch x data-parallel size "
            f"= {micro} x {dp} = {per_step} ({size}); {batch_choices(cfg, world, gbs)}"
        )
    return gbs // per_step


def resolved_dtype(cfg: RootConfig) -> str:
    """deepspeed.dtype with auto resolved: bf16 on GPUs, fp32 on CPUs."""
    if cfg.deepspeed.dtype == Dtype.auto:
        return "bf16" if int(cfg.gpus_per_node) > 0 else "fp32"
    return str(cfg.deepspeed.dtype)
