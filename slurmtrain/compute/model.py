"""The OPT model, built from config with transformers' classes: nothing is downloaded.

Initialisation follows the config: weights ~ N(0, model.init_std) (transformers' OPT init), and with
model.scaled_init the residual branches' output projections (attention out_proj, fc2) get
init_std / sqrt(2 * num_layers), as metaseq's --full-megatron-init trains OPT: each of the 2L
residual additions then adds variance ~1/(2L), so the residual stream does not grow with depth.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig


def opt_config(cfg: DictConfig) -> Any:
    from transformers import OPTConfig

    m = cfg.model
    return OPTConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        ffn_dim=m.ffn_dim,
        num_attention_heads=m.num_heads,
        max_position_embeddings=m.max_positions,
        word_embed_proj_dim=m.word_embed_proj_dim or m.hidden_size,
        do_layer_norm_before=m.layer_norm_before,
        dropout=m.dropout,
        attention_dropout=m.dropout,
        activation_dropout=0.0,
        layerdrop=0.0,
        enable_bias=True,
        use_cache=False,
        init_std=m.init_std,
        # No padding id: we never pad, and zeroing its embedding row fails on ZeRO-3 partitions.
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
    )


def build(cfg: DictConfig, ds_config: dict[str, Any]) -> torch.nn.Module:
    """ZeRO-3 builds under `deepspeed.zero.Init` so no rank ever holds the whole model."""
    import deepspeed
    from transformers import OPTForCausalLM

    torch.manual_seed(cfg.train.seed)
    with deepspeed.zero.Init(config_dict_or_path=ds_config, enabled=cfg.deepspeed.stage == 3):
        if cfg.model.pretrained_path:
            model = OPTForCausalLM.from_pretrained(cfg.model.pretrained_path, local_files_only=True)
        else:
            model = OPTForCausalLM(opt_config(cfg))
    if not cfg.model.pretrained_path:
        scaled = scaled_std(cfg) if cfg.model.scaled_init else None
        if cfg.deepspeed.stage == 3:
            _init_partitioned(model, scaled)
        elif scaled is not None:  # HF's init ran whole in the constructor: redo the projections
            with torch.no_grad():
                for module in output_projections(model):
                    module.weight.normal_(0.0, scaled)
    if cfg.model.activation_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def scaled_std(cfg: DictConfig) -> float:
    """The output projections' std: init_std / sqrt(2 * num_layers) (0.006 -> 0.00067 for 40 layers)."""
    return cfg.model.init_std / math.sqrt(2 * cfg.model.num_layers)


def output_projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The Linear layers that write into the residual stream: each layer's attention out_proj and
    its second MLP matrix fc2 (2 per layer)."""
    return [
        m
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.endswith(("self_attn.out_proj", ".fc2"))
    ]


def _init_partitioned(model: torch.nn.Module, scaled: float | None = None) -> None:
    """Hugging Face's weight init ran on ZeRO-3's empty partitions; redo it one module at a time,
    gathering only that module's parameters (memory: the largest layer, never the whole model).
    Rank 0 initialises (modifier_rank=0) and DeepSpeed re-partitions its values to every rank, so
    the scaled projections are scaled the same everywhere."""
    import deepspeed

    projections = {id(m) for m in output_projections(model)} if scaled is not None else set()
    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            model._init_weights(module)
            if id(module) in projections:
                with torch.no_grad():
                    module.weight.normal_(0.0, scaled)


def loss_fn(model: torch.nn.Module, window: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy; inputs are window[:, :-1], labels window[:, 1:]."""
    logits = model(input_ids=window[:, :-1]).logits
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1)
    )
