"""Per-GPU memory plan for a decoder under DeepSpeed ZeRO, and the cheapest setting that fits.

Pure arithmetic for the login node (no torch/deepspeed import): a job that cannot fit should fail
here, not after hours in the queue. Model states follow DeepSpeed 0.19.8's own estimators, per GPU,
P params, N GPUs in all, 16-bit training (fp32 doubles every 2-byte term):
- stage 0: 2P params + 6P grads (16-bit and fp32) + 12P optimizer (fp32 master, Adam m and v).
- stage 1: zero2's formula plus 2P(1 - 1/N): its 16-bit grads stay whole until the reduce
  (DeepSpeed has no stage-1 estimator).
- stage 2: 2P + 18P/N (zero2's); offload_optimizer moves the 16 fp32 bytes/param to the host.
- stage 3: 18P/N + 4L, L the largest module's params (one gathered param and grad); the 18 includes
  the fp32 grad copy stage 3 materialises one sub_group at a time.
Host memory per node: planning/host_memory.py (the model is built on the GPU in the training dtype,
offloaded states, async saves' pinned copies, the ranks' processes). Per node, not per job as
DeepSpeed's zero2+offload estimate has it (the two agree on one node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional, TypedDict

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.validation import check_seq_len, check_zero
from slurmtrain.planning import parallel_plan
from slurmtrain.planning.activations import LOGIT_BYTES, activation_bytes  # noqa: F401
from slurmtrain.planning.host_memory import HOST_FIX, HostPlan, host_plan, misfit
from slurmtrain.planning.shapes import (  # noqa: F401  (part of this module's API)
    OPT_SIZES,
    ModelShape,
    OptShape,
    attention_width,
    embed_dim,
    gated_mlp,
    head_dim,
    kv_heads,
    largest_layer_params,
    param_count,
)
from slurmtrain.planning.zero_states import REDUCE_BUCKET as REDUCE_BUCKET  # re-exported
from slurmtrain.planning.zero_states import ModelStates, Shards, comm_buffers, model_states

GiB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

CUDA_CONTEXT = int(1.5 * GiB)  # CUDA context + cuBLAS workspaces + NCCL channel buffers
FRAGMENTATION = 0.05  # caching-allocator slack, as a share of everything PyTorch allocates


class Knobs(TypedDict):
    """A Setting as `plan_memory` keyword arguments."""

    stage: int
    offload_optimizer: bool
    offload_param: bool
    micro_batch: int
    activation_checkpointing: bool


@dataclass(frozen=True)
class Setting:
    """The knobs the planner may turn: what `recommend` returns and the summary names."""

    stage: int
    offload_optimizer: bool = False
    offload_param: bool = False
    micro_batch: int = 1
    activation_checkpointing: bool = False

    def knobs(self) -> Knobs:
        """This setting as `plan_memory` keyword arguments."""
        return {
            "stage": self.stage,
            "offload_optimizer": self.offload_optimizer,
            "offload_param": self.offload_param,
            "micro_batch": self.micro_batch,
            "activation_checkpointing": self.activation_checkpointing,
        }

    def label(self) -> str:
        text = f"zero{self.stage}"
        if self.offload_optimizer:
            text += "+offload_opt"
        if self.offload_param:
            text += "+offload_param"
        return f"{text} mb={self.micro_batch}" + (" ckpt" if self.activation_checkpointing else "")

    def overrides(self, current: Optional[Setting] = None) -> str:
        """Hydra overrides selecting this setting (only those that differ from `current`)."""
        parts = []
        if current is None or (self.stage, self.offload_optimizer, self.offload_param) != (
            current.stage,
            current.offload_optimizer,
            current.offload_param,
        ):
            if self.stage == 3 and self.offload_optimizer and self.offload_param:
                parts.append("deepspeed=zero3_offload")
            else:
                parts.append(f"deepspeed=zero{self.stage}")
                if self.offload_optimizer:
                    parts.append("deepspeed.offload_optimizer=true")
        if current is None or self.micro_batch != current.micro_batch:
            parts.append(f"train.micro_batch_size={self.micro_batch}")
        if current is None or self.activation_checkpointing != current.activation_checkpointing:
            ckpt = str(self.activation_checkpointing).lower()
            parts.append(f"model.activation_checkpointing={ckpt}")
        return " ".join(parts)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU by part, and host bytes per node; `total` is what must fit on one GPU."""

    model: str
    setting: Setting
    nodes: int
    gpus_per_node: int
    seq_len: int
    dtype: str
    num_params: int
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int  # communication buckets
    overhead: int  # CUDA context + fragmentation
    cpu_per_node: int  # host memory of one node: host.total
    host: HostPlan

    @property
    def host_pinned(self) -> int:
        """Async saves' pinned host copies on one node."""
        return int(self.host.pinned)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def model_states(self) -> int:
        """Params + grads + optimizer: the part DeepSpeed's estimators compute."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.buffers + self.overhead

    def fits(self, gpu_mem_bytes: int, cpu_mem_bytes_per_node: Optional[int] = None) -> bool:
        cpu_ok = cpu_mem_bytes_per_node is None or self.cpu_per_node <= cpu_mem_bytes_per_node
        return self.total <= gpu_mem_bytes and cpu_ok


class Recommendation(NamedTuple):
    setting: Setting
    plan: MemoryPlan


def _check(
    model: ModelShape,
    s: Setting,
    nodes: int,
    gpus_per_node: int,
    seq_len: int,
    dtype: str,
    attention: str,
) -> None:
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"deepspeed.dtype={dtype!r}: the planner knows bf16, fp16, fp32")
    check_zero(s.stage, s.offload_optimizer, s.offload_param)
    if attention not in ("sdpa", "eager"):
        raise ConfigError(f"attention={attention!r}: the planner knows sdpa, eager")
    for key, value in (
        ("nodes", nodes),
        ("gpus_per_node", gpus_per_node),
        ("train.micro_batch_size", s.micro_batch),
        ("data.seq_len", seq_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r}: the GPU memory plan needs a positive integer")
    check_seq_len(seq_len, model.max_positions)


def plan_memory(
    model: ModelShape,
    *,
    stage: int = 2,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    nodes: int = 1,
    gpus_per_node: int = 8,
    micro_batch: int = 1,
    seq_len: int = 2048,
    dtype: str = "bf16",
    activation_checkpointing: bool = False,
    attention: str = "sdpa",
    zero_init: bool = True,
    reduce_bucket: int = REDUCE_BUCKET,
    overlap_comm: bool = False,
    device: str = "cuda",
    zero3: Optional[Mapping[str, object]] = None,
    pretrained: bool = False,
    async_save: bool = False,
    tensor_parallel: int = 1,
) -> MemoryPlan:
    """Bytes one GPU (and one node's host memory) needs for this model and ZeRO setting.

    `zero_init`: stage 3 builds the model under deepspeed.zero.Init, so no rank ever holds it
    whole (without it every rank builds it whole). `pretrained`: each rank loads
    model.pretrained_path on the host first; `async_save`: pinned host copies of each rank's saved
    state (planning/host_memory.py). `reduce_bucket`, `overlap_comm`: the run's ZeRO settings
    (ds_config.zero_section); `zero3`: that section's stage3_* keys (None: what ds_config gives
    this model). `device="cpu"` (CPU ranks): no CUDA context, no caching allocator.
    `tensor_parallel`: a TP rank's params (planning/parallel_plan.py), ZeRO over world / TP.
    """
    setting = Setting(
        stage, offload_optimizer, offload_param, micro_batch, activation_checkpointing
    )
    _check(model, setting, nodes, gpus_per_node, seq_len, dtype, attention)
    d, tp = DTYPE_BYTES[dtype], max(1, tensor_parallel)
    n = max(1, nodes * gpus_per_node // tp)  # ZeRO partitions over data parallelism
    shards = Shards(parallel_plan.rank_params(model, tp), largest_layer_params(model), n, d)
    states = model_states(shards, stage, offload_optimizer, offload_param, fp32=dtype == "fp32")
    buffers = comm_buffers(model, shards, stage, reduce_bucket, overlap_comm, zero3)
    acts = activation_bytes(model, micro_batch, seq_len, d, activation_checkpointing, attention, tp)
    node = host_plan(
        params=shards.params,
        largest_layer=shards.largest_layer,
        stage=stage,
        dtype_bytes=d,
        world=n,
        gpus_per_node=gpus_per_node,
        offloaded_per_rank=states.offloaded,
        zero_init=zero_init,
        pretrained=pretrained,
        async_save=async_save,
    )
    return _recorded(
        model, setting, nodes, gpus_per_node, seq_len, dtype, states, acts, buffers, node, device
    )


def _recorded(
    model: ModelShape,
    setting: Setting,
    nodes: int,
    gpus_per_node: int,
    seq_len: int,
    dtype: str,
    states: ModelStates,
    activations: float,
    buffers: float,
    host: HostPlan,
    device: str,
) -> MemoryPlan:
    """The plan in whole bytes (arguments in MemoryPlan's field order), with the overhead: a CPU
    rank has no CUDA context and no caching allocator to fragment."""
    allocated = states.params + states.grads + states.optimizer + activations + buffers
    return MemoryPlan(
        model=model.name,
        setting=setting,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        seq_len=seq_len,
        dtype=dtype,
        num_params=param_count(model),
        params=int(states.params),
        grads=int(states.grads),
        optimizer=int(states.optimizer),
        activations=int(activations),
        buffers=int(buffers),
        overhead=int(CUDA_CONTEXT + FRAGMENTATION * allocated) if device == "cuda" else 0,
        cpu_per_node=host.total,
        host=host,
    )


# Search order, dearest knob outermost: offload (PCIe traffic + a CPU Adam step every update), then
# activation checkpointing (one more forward: ~+33% compute), then ZeRO stage (0-2 move the same
# bytes as plain data parallelism, 3 moves 1.5x), then the largest micro batch.
OFFLOAD_LEVELS = ((False, False), (True, False), (True, True))


def candidates(max_micro_batch: int = 16) -> list[Setting]:
    """Every setting `recommend` tries, cheapest first."""
    batches = [2**i for i in range(max(max_micro_batch, 1).bit_length())][::-1]
    batches = [b for b in batches if b <= max_micro_batch]
    out = []
    for opt, prm in OFFLOAD_LEVELS:
        for ckpt in (False, True):
            for stage in range(4):
                if (opt and stage == 0) or (prm and stage != 3):
                    continue
                out += [Setting(stage, opt, prm, b, ckpt) for b in batches]
    return out


def recommend(
    model: ModelShape,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu_mem_bytes: int,
    seq_len: int = 2048,
    dtype: str = "bf16",
    max_micro_batch: int = 16,
    global_batch_size: Optional[int] = None,
    cpu_mem_bytes_per_node: Optional[int] = None,
    attention: str = "sdpa",
    reduce_bucket: int = REDUCE_BUCKET,
    overlap_comm: bool = False,
    zero3: Optional[Mapping[str, object]] = None,
    pretrained: bool = False,
    async_save: bool = False,
    tensor_parallel: int = 1,
) -> Optional[Recommendation]:
    """The cheapest setting (see `candidates`) whose plan fits, or None when nothing does.

    With `global_batch_size`, only micro batches that divide it evenly over all GPUs are tried.
    """
    world = nodes * gpus_per_node // max(1, tensor_parallel)  # data-parallel size
    for s in candidates(max_micro_batch):
        if global_batch_size is not None and global_batch_size % (s.micro_batch * world):
            continue
        if tensor_parallel > 1 and s.stage in (0, 3):  # refused (common/validation_parallel.py)
            continue
        plan = plan_memory(
            model,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            seq_len=seq_len,
            dtype=dtype,
            attention=attention,
            reduce_bucket=reduce_bucket,
            overlap_comm=overlap_comm,
            zero3=zero3,
            pretrained=pretrained,
            async_save=async_save,
            tensor_parallel=tensor_parallel,
            **s.knobs(),
        )
        if plan.fits(gpu_mem_bytes, cpu_mem_bytes_per_node):
            return Recommendation(s, plan)
    return None


def summary(
    plan: MemoryPlan,
    gpu_mem_bytes: int,
    recommendation: Optional[Recommendation] = None,
    cpu_mem_bytes: Optional[int] = None,
    gpu_key: str = "",
) -> str:
    """One line: the plan against the GPU (`gpu_key`: the key its size came from) and the host,
    and (when it does not fit) what would."""
    s = plan.setting
    head = f"{plan.model} {s.label()} seq={plan.seq_len}: {plan.total / GiB:.1f} GiB/GPU"
    limit = f"{gpu_mem_bytes / GiB:.1f} GiB" + (f" ({gpu_key})" if gpu_key else "")
    host = misfit(plan.cpu_per_node, cpu_mem_bytes, plan.host.parts())
    if plan.total <= gpu_mem_bytes and host is None:
        return f"{head} <= {limit} (fits)"
    head += f" > {limit}" if plan.total > gpu_mem_bytes else f" <= {limit}"
    head += f"; {host}" if host else ""
    if recommendation is None:
        what = "add nodes or shorten data.seq_len" if not host else HOST_FIX
        return f"{head}; nothing fits on {plan.nodes}x{plan.gpus_per_node} GPUs: {what}"
    fix = recommendation.setting.overrides(current=s)
    if not fix:  # the same setting fits: only the host is short of this plan
        return f"{head}; {HOST_FIX}"
    return f"{head}; fits with {fix} ({recommendation.plan.total / GiB:.1f} GiB)"


__all__ = [
    "GiB",
    "OPT_SIZES",
    "OptShape",
    "Setting",
    "MemoryPlan",
    "Recommendation",
    "param_count",
    "largest_layer_params",
    "activation_bytes",
    "plan_memory",
    "candidates",
    "recommend",
    "summary",
]
