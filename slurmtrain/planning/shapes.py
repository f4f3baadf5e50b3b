"""OPT model shapes and their parameter counts: what every planner (memory, FLOPs) reads.

Counts match transformers' OPTForCausalLM (tied lm_head counted once); tests compare them with
DeepSpeed's own counter and with conf/model/*.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol


class ModelShape(Protocol):
    """What the planner reads from a model config (slurmtrain.common.schema.ModelConfig has it)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_dim: int
    vocab_size: int
    max_positions: int


@dataclass(frozen=True)
class OptShape:
    """An OPT architecture (Zhang et al. 2022, table 1): the reference table tests check against."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_dim: int
    vocab_size: int = 50272
    max_positions: int = 2048
    word_embed_proj_dim: Optional[int] = None
    layer_norm_before: bool = True


OPT_SIZES: dict[str, OptShape] = {
    s.name: s
    for s in (
        OptShape("opt125m", 12, 768, 12, 3072),
        OptShape("opt350m", 24, 1024, 16, 4096, word_embed_proj_dim=512, layer_norm_before=False),
        OptShape("opt1.3b", 24, 2048, 32, 8192),
        OptShape("opt2.7b", 32, 2560, 32, 10240),
        OptShape("opt6.7b", 32, 4096, 32, 16384),
        OptShape("opt13b", 40, 5120, 40, 20480),
        OptShape("opt30b", 48, 7168, 56, 28672),
        OptShape("opt66b", 64, 9216, 72, 36864),
    )
}


def embed_dim(model: ModelShape) -> int:
    return getattr(model, "word_embed_proj_dim", None) or model.hidden_size


def param_count(model: ModelShape) -> int:
    """Parameters of Hugging Face's OPTForCausalLM of this shape (lm_head tied to the embedding)."""
    h, f, e = model.hidden_size, model.ffn_dim, embed_dim(model)
    layer = (4 * h * h + 4 * h) + (2 * h * f + f + h) + 2 * 2 * h  # attention, MLP, 2 layernorms
    total = model.vocab_size * e + (model.max_positions + 2) * h + model.num_layers * layer
    if e != h:
        total += 2 * e * h  # project_in / project_out, no bias
    if getattr(model, "layer_norm_before", True):
        total += 2 * h  # final layernorm (absent in post-LN OPT-350m)
    return total


def largest_layer_params(model: ModelShape) -> int:
    """Params of the biggest single module, as DeepSpeed's stage3 `model_to_params` counts them."""
    h, f = model.hidden_size, model.ffn_dim
    return max(
        model.vocab_size * embed_dim(model),
        (model.max_positions + 2) * h,
        h * f + f,
        f * h + h,
        h * h + h,
    )
