"""Tensor and sequence parallelism in the plan (parallel.tensor, DeepSpeed AutoTP; parallel.sequence,
DeepSpeed Ulysses): what each rank holds, the FLOPs it computes and the communication a step moves.

Pure arithmetic for the login node. AutoTP splits the transformer layers' linear layers (q, k, v,
out and the MLP's: column-parallel then row-parallel) over the TP group; embeddings, norms and the
output head stay whole (slurmtrain keeps the head whole: the loss reads full logits), so a TP rank
holds P - sharded x (1 - 1/TP) parameters, and ZeRO partitions those over the data-parallel group
(DP = world / TP). Activations per TP rank follow Korthikanti et al. 2022 with TP and no sequence
parallelism (planning/activations.py).

Communication per optimizer step (message sizes are the logical tensors, as NCCL is handed them):
- TP: Megatron's f/g operators: each layer all-reduces its attention and MLP outputs forward (2)
  and their inputs' gradients backward (2), each micro_batch x seq x hidden in the training dtype,
  within the node; activation checkpointing recomputes the forward (2 more).
- SP (parallel.sequence, DeepSpeed Ulysses): each rank holds micro x seq/SP tokens; every layer's
  attention all-to-alls q, k, v (sequence shards -> head shards) and its output back: 4 forward, 4
  backward (4 more recomputed with activation checkpointing), each rank sending its micro x seq/SP
  x width slice (q and output: heads x head_dim, k and v: kv heads x head_dim). Weights are whole
  on every SP rank: ZeRO partitions them over data x sequence ranks (DeepSpeed's
  seq_data_parallel group), gradients summed over SP and averaged over DP = world / SP.
- DP (ZeRO over the TP rank's P_tp parameters, gradients in the communication dtype, fp32 for
  bf16: common/ds_config.precision): ZeRO-0 all-reduces the gradients once a step; ZeRO-1
  reduce-scatters them once and all-gathers the updated parameters; ZeRO-2 reduce-scatters every
  micro step; ZeRO-3 all-gathers the parameters twice (forward, backward) and reduce-scatters the
  gradients every micro step.
"""

from __future__ import annotations

from slurmtrain.planning import shapes
from slurmtrain.planning.shapes import ModelShape


def sharded_params(model: ModelShape) -> int:
    """Parameters AutoTP splits: the layers' matmul weights (no embeddings, no head)."""
    e, h = shapes.embed_dim(model), model.hidden_size
    outside = model.vocab_size * e + (2 * e * h if e != h else 0)  # head; OPT-350m's projections
    return max(0, shapes.matmul_params(model) - outside)


def rank_params(model: ModelShape, tp: int) -> int:
    """Parameters one TP rank holds before ZeRO partitions them over data parallelism."""
    total = shapes.param_count(model)
    return total if tp <= 1 else total - sharded_params(model) * (tp - 1) // tp


def _gb(nbytes: float) -> str:
    if nbytes >= 1e12:
        return f"{nbytes / 1e12:.2f} TB"
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.1f} GB"
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def _params(n: float) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def tp_line(model: ModelShape, tp: int, world: int, flops_per_step: float) -> str:
    """What TP x DP means for this run: parameters per TP rank and FLOPs per GPU a step."""
    p, mine = shapes.param_count(model), rank_params(model, tp)
    return (
        f"plan: tensor-parallel {tp} x data-parallel {world // tp} (DeepSpeed AutoTP within each "
        f"node): a TP rank holds {_params(mine)} of the {_params(p)} params (the layers' "
        f"matmuls / {tp}; embeddings, norms and the output head whole), ZeRO partitions them "
        f"over {world // tp} ranks; each GPU computes {flops_per_step / world / 1e12:,.0f} TFLOP "
        f"a step (1/{world} of {flops_per_step / 1e15:,.1f} PFLOP)"
    )


def sp_line(model: ModelShape, sp: int, world: int, seq_len: int, flops_per_step: float) -> str:
    """What SP x DP means for this run: the sequence slice per rank and FLOPs per GPU a step."""
    return (
        f"plan: sequence-parallel {sp} x data-parallel {world // sp} (DeepSpeed Ulysses): each "
        f"rank holds {seq_len // sp:,} of each sequence's {seq_len:,} tokens (activations / {sp}) "
        f"and 1/{sp} of the heads inside attention; the {_params(shapes.param_count(model))} "
        f"params are whole per SP rank, ZeRO partitions them over {world} ranks (data x "
        f"sequence); each GPU computes {flops_per_step / world / 1e12:,.0f} TFLOP a step "
        f"(1/{world} of {flops_per_step / 1e15:,.1f} PFLOP)"
    )


def _sp_part(model: ModelShape, sp: int, micro: int, seq: int, accum: int, d: int, ck: bool) -> str:
    """Ulysses' all-to-alls a step (module docstring), sized as one rank sends them."""
    per_layer = 12 if ck else 8
    q, kv = shapes.attention_width(model), shapes.kv_heads(model) * shapes.head_dim(model)
    tokens = micro * (seq // sp)
    layer_bytes = tokens * (2 * q + 2 * kv) * d * per_layer // 4  # q, k, v, output each pass
    total = layer_bytes * model.num_layers * accum
    how = "4 forward, 4 backward" + (", 4 recompute" if ck else "")
    return (
        f"SP all-to-alls over {sp} ranks: {per_layer} a layer a micro step ({how}: q, k, v, "
        f"output) x {model.num_layers} layers x {accum} micro steps of micro {micro} x seq "
        f"{seq // sp} x width {q} (k, v: {kv}) x {d} B = {_gb(layer_bytes)} a layer a micro "
        f"step ({_gb(total)} a step)"
    )


def comm_line(
    model: ModelShape,
    *,
    tp: int,
    world: int,
    stage: int,
    micro_batch: int,
    accum: int,
    seq_len: int,
    dtype_bytes: int,
    grad_bytes: int,
    checkpointing: bool = False,
    sp: int = 1,
) -> str:
    """The plan's line naming the collectives one optimizer step makes, with their sizes."""
    dp = world // tp // sp
    parts = []
    if sp > 1:
        parts.append(_sp_part(model, sp, micro_batch, seq_len, accum, dtype_bytes, checkpointing))
    if tp > 1:
        per_layer = 6 if checkpointing else 4
        size = micro_batch * seq_len * model.hidden_size * dtype_bytes
        count = per_layer * model.num_layers * accum
        how = "2 forward, 2 backward" + (", 2 recompute" if checkpointing else "")
        parts.append(
            f"TP all-reduces within each node: {per_layer} a layer a micro step ({how}) x "
            f"{model.num_layers} layers x {accum} micro steps = {count:,} of micro "
            f"{micro_batch} x seq {seq_len} x hidden {model.hidden_size} x {dtype_bytes} B = "
            f"{_gb(size)} each ({_gb(size * count)} a step)"
        )
    mine = rank_params(model, tp)
    params, grads = mine * dtype_bytes, mine * grad_bytes
    if stage == 0:
        dp_text, total = f"an all-reduce of {_gb(grads)} of gradients a step", grads
    elif stage == 1:
        dp_text = f"a reduce-scatter of {_gb(grads)} of gradients and an all-gather of {_gb(params)} of params a step"
        total = grads + params
    elif stage == 2:
        dp_text = (
            f"a reduce-scatter of {_gb(grads)} of gradients each micro step ({accum}) and an "
            f"all-gather of {_gb(params)} of params a step"
        )
        total = accum * grads + params
    else:
        dp_text = (
            f"2 all-gathers of {_gb(params)} of params and a reduce-scatter of {_gb(grads)} of "
            f"gradients each micro step ({accum})"
        )
        total = accum * (2 * params + grads)
    over = f"{dp} ranks of the TP rank's" if sp == 1 else f"{dp * sp} ranks (data x sequence) of"
    parts.append(
        f"DP (ZeRO-{stage}) over {over} {_params(mine)} params: {dp_text} ({_gb(total)} a step)"
    )
    return "plan: communication per step: " + "; ".join(parts)
