"""Activation memory of a decoder layer stack (planning/memory.py's activations term).

Pure arithmetic for the login node, from Korthikanti et al. 2022 (no tensor/sequence parallelism).
"""

from __future__ import annotations

from slurmtrain.planning.shapes import (
    ModelShape,
    attention_width,
    gated_mlp,
    head_dim,
    kv_heads,
)

# Per logit element (b*s*vocab): 16-bit logits + fp32 log-softmax kept by the loss + its grad.
LOGIT_BYTES = {2: 2 + 4 + 4, 4: 4 + 4 + 4}


def activation_bytes(
    model: ModelShape,
    micro_batch: int,
    seq_len: int,
    dtype_bytes: int,
    checkpointing: bool,
    attention: str = "sdpa",
    tp: int = 1,
) -> int:
    """Activations kept for backward (Korthikanti et al. 2022, no tensor/sequence parallelism).

    One layer keeps s*b*h*(34 + 5*a*s/h) bytes in 16-bit: 34 sbh of inputs/outputs of its
    matmuls, norms and masks, 5 a s^2 b of attention scores. Fused attention (PyTorch SDPA's
    flash/memory-efficient kernels, Hugging Face OPT's default) keeps no scores, so "sdpa" drops
    the second term and "eager" keeps it. Checkpointing each layer keeps only its 16-bit input
    (2 sbh) plus one layer's full activations during its recompute. fp32 doubles the 2-byte terms.
    Logits and the loss's fp32 log-softmax (LOGIT_BYTES per element) come on top either way.
    Gated (Llama-shaped) layers keep, per token in 16-bit: 2 norm inputs 4h, attention 2h + 2(a*d)
    + 4 kv*d (input, q, k, v) + 2(a*d) (output), MLP 2h + 8f (input; gate, up, SiLU(gate), product)
    and no dropout masks (shapes.gated_mlp).
    Tensor parallelism `tp` (no sequence parallelism) splits what lies between the column- and
    row-parallel matmuls: 34 -> 10 + 24/tp (Korthikanti's eq. 2), the scores / tp; the gated
    layer's q, k, v, attention output and MLP inner terms / tp. The logits stay whole.
    Sequence parallelism (Ulysses) is planned by passing `seq_len` / SP (planning/preflight.py):
    every term is per local token, attention's inside Ulysses too (whole sequences of 1/SP of
    the heads: the same size), and the logits are the slice's; eager attention is refused with SP.
    """
    s, b, h, a = seq_len, micro_batch, model.hidden_size, model.num_heads
    t = max(1, tp)
    scores = 5 * a * s * s * b // t if attention == "eager" else 0
    per_token = 10 * h + 24 * h // t  # bytes in 16-bit
    if gated_mlp(model):
        q, kv = attention_width(model), kv_heads(model) * head_dim(model)
        per_token = 4 * h + (2 * h + (4 * q + 4 * kv) // t) + (2 * h + 8 * model.ffn_dim // t)
    per_layer = (per_token * s * b + scores) * dtype_bytes // 2
    layers = (
        model.num_layers * 2 * s * b * h * dtype_bytes // 2 + per_layer
        if checkpointing
        else model.num_layers * per_layer
    )
    return layers + s * b * model.vocab_size * LOGIT_BYTES[dtype_bytes]
