"""ZeRO's bytes on one GPU: the model states of each stage and the communication buckets.

The arithmetic behind planning/memory.py's plan (its docstring gives the formulas, after
DeepSpeed 0.19.8's estimators): what a rank keeps of params, grads and optimizer state, what
offload moves to the host, and the buckets DeepSpeed allocates to reduce or all-reduce gradients.
Pure arithmetic, no torch/deepspeed import.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

from slurmtrain.planning import zero3_params
from slurmtrain.planning.shapes import ModelShape

# DeepSpeed defaults (deepspeed/runtime/zero/config.py, engine.py), in elements.
# reduce_bucket_size: with contiguous_gradients DeepSpeed allocates the whole bucket (torch.empty of
# reduce_bucket_size elements, however small the model; two with overlap_comm in stages 1-2) for
# the gradients being reduced. The all-gather after step writes into the params' own flat buffer.
REDUCE_BUCKET = 500_000_000
ALLREDUCE_BUCKET = 500_000_000  # engine MEMORY_OPT_ALLREDUCE_SIZE: stage-0 grad all-reduce


class Shards(NamedTuple):
    """How ZeRO splits the model: what one rank trains and over how many ranks it partitions."""

    params: int  # one tensor-parallel rank's params
    largest_layer: int  # params of the largest module (stage 3 gathers one at a time)
    ranks: int  # data-parallel ranks: ZeRO partitions over these
    dtype_bytes: int  # the training dtype's bytes per element


class ModelStates(NamedTuple):
    """Bytes per GPU of params, grads and optimizer state; `offloaded`: per GPU, on the host."""

    params: float
    grads: float
    optimizer: float
    offloaded: float = 0


def model_states(
    shards: Shards, stage: int, offload_optimizer: bool, offload_param: bool, fp32: bool
) -> ModelStates:
    """One GPU's share of the model states under this ZeRO stage and offload setting."""
    p, n, d = shards.params, shards.ranks, shards.dtype_bytes
    master = 0 if (fp32 and stage == 0) else 4  # ZeRO always keeps an fp32 copy
    if stage == 0:
        return ModelStates(d * p, (d + master) * p, (8 + master) * p)
    if stage in (1, 2):
        grads16 = d * p if stage == 1 else d * p / n
        if offload_optimizer:  # fp32 grads, master and moments on the host
            return ModelStates(d * p, grads16 if stage == 1 else 0, 0, 16 * p / n)
        return ModelStates(d * p, grads16 + 4 * p / n, 12 * p / n)
    work = 2 * d * shards.largest_layer  # one gathered layer: its param and its grad
    params = (0 if offload_param else d * p / n) + work / 2
    state = (d + 2) * p / n + 12 * p / n  # grads16 + DeepSpeed's fp32-grad budget + optimizer
    if offload_optimizer:
        return ModelStates(params, work / 2, 0, state + (d * p / n if offload_param else 0))
    return ModelStates(params, (d + 2) * p / n + work / 2, 12 * p / n)


def comm_buffers(
    model: ModelShape,
    shards: Shards,
    stage: int,
    reduce_bucket: int,
    overlap_comm: bool,
    zero3: Optional[Mapping[str, object]],
) -> float:
    """Bytes of the gradient buckets one GPU holds while reducing (stage 3: and its prefetch)."""
    d = shards.dtype_bytes
    if stage == 0:
        return d * min(ALLREDUCE_BUCKET, shards.params)  # the flattened grads of one all-reduce
    if stage < 3:
        return d * reduce_bucket * (2 if overlap_comm else 1)
    return d * (reduce_bucket + zero3_params.extra_gathered(model, zero3))
