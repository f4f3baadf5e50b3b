"""Numbers derived from a config: node range, ranks per node, world size, grad accumulation, dtype.

Pure arithmetic on the schema's types, shared by validation, the planner, the login flow and the
compute side; it imports nothing of the package but the schema and its errors. `Derived` holds
them for one config, each computed once: the login side attaches it to the checked config at the
start of `check` (login/prepare.py) and the plan, the cluster check and the batch script read it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, TypeVar, cast

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import ClusterKind, Dtype, RootConfig

T = TypeVar("T")


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
    return _parallel_text(tensor_parallel(cfg), sequence_parallel(cfg))


def _parallel_text(tp: int, sp: int) -> str:
    parts = [f"tensor-parallel {tp}"] * (tp > 1) + [f"sequence-parallel {sp}"] * (sp > 1)
    return " x ".join(parts)


def data_parallel(cfg: RootConfig, world: int) -> int:
    """Data-parallel size: world / (TP x SP) (a TP or SP group reads one batch)."""
    return _data_parallel(cfg, world, tensor_parallel(cfg), sequence_parallel(cfg))


def _data_parallel(cfg: RootConfig, world: int, tp: int, sp: int) -> int:
    mp = tp * sp
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
    tp, sp = tensor_parallel(cfg), sequence_parallel(cfg)
    return _grad_accumulation(cfg, world, _data_parallel(cfg, world, tp, sp), tp, sp)


def _grad_accumulation(cfg: RootConfig, world: int, dp: int, tp: int, sp: int) -> int:
    micro = int(cfg.train.micro_batch_size)
    per_step = micro * dp
    gbs = cfg.train.global_batch_size
    if gbs is None:
        raise ConfigError(
            "train.global_batch_size=None: not resolved; validation.resolve_batch fills it in"
        )
    if gbs % per_step:
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


@dataclass(frozen=True)
class Derived:
    """Every number above for one config, each computed on first use and then only read."""

    cfg: RootConfig = field(repr=False, compare=False)
    params: Optional[int] = None  # the model's parameter count, when the builder knows it

    @functools.cached_property
    def nodes(self) -> tuple[int, int]:
        return node_range(self.cfg.nodes)

    @functools.cached_property
    def per_node(self) -> int:
        return tasks_per_node(self.cfg)

    @functools.cached_property
    def tensor(self) -> int:
        return tensor_parallel(self.cfg)

    @functools.cached_property
    def sequence(self) -> int:
        return sequence_parallel(self.cfg)

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.sequence

    @functools.cached_property
    def dtype(self) -> str:
        return resolved_dtype(self.cfg)

    @functools.cached_property
    def in_allocation(self) -> bool:
        return restarts_in_allocation(self.cfg)

    @property
    def parallel_text(self) -> str:
        return _parallel_text(self.tensor, self.sequence)

    def world(self, nodes: Optional[int] = None) -> int:
        return (nodes or self.nodes[1]) * self.per_node

    def data_parallel(self, world: int) -> int:
        tp, sp = self.tensor, self.sequence
        return self.once(("dp", world), lambda: _data_parallel(self.cfg, world, tp, sp))

    def grad_accumulation(self, world: int) -> int:
        dp, tp, sp = self.data_parallel(world), self.tensor, self.sequence
        return self.once(("ga", world), lambda: _grad_accumulation(self.cfg, world, dp, tp, sp))

    def once(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()` the first time `key` is asked for; its value after that (the planner's
        layout, deadlines and throughput for a node count, which several plan lines read)."""
        memo: dict[Hashable, Any] = self.__dict__.setdefault("_memo", {})
        if key not in memo:
            memo[key] = compute()
        return cast(T, memo[key])


_ATTACHED = "_derived"


def attach(cfg: RootConfig, params: Optional[int] = None) -> Derived:
    """A Derived for `cfg` (a checked config's dataclasses), kept on it for `derived_of` to find."""
    found = Derived(cfg, params)
    cfg.__dict__[_ATTACHED] = found
    return found


def derived_of(cfg: RootConfig) -> Derived:
    """`cfg`'s attached Derived; a new one (computing on use) for any other config."""
    found = getattr(cfg, "__dict__", {}).get(_ATTACHED)
    return found if isinstance(found, Derived) else Derived(cfg)
