"""The OPT model, built from config with transformers' classes: nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig


def opt_config(cfg: DictConfig) -> Any:
    from transformers import OPTConfig

    m = cfg.model
    return OPTConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        ffn_dim=m.ffn_dim, num_attention_heads=m.num_heads, max_position_embeddings=m.max_positions,
        word_embed_proj_dim=m.word_embed_proj_dim or m.hidden_size,
        do_layer_norm_before=m.layer_norm_before, dropout=m.dropout, attention_dropout=m.dropout,
        activation_dropout=0.0, layerdrop=0.0, enable_bias=True, use_cache=False,
        # No padding id: we never pad, and zeroing its embedding row fails on ZeRO-3 partitions.
        pad_token_id=None, bos_token_id=1, eos_token_id=2)


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
    if cfg.deepspeed.stage == 3 and not cfg.model.pretrained_path:
        _init_partitioned(model)
    if cfg.model.activation_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def _init_partitioned(model: torch.nn.Module) -> None:
    """Hugging Face's weight init ran on ZeRO-3's empty partitions; redo it one module at a time,
    gathering only that module's parameters (memory: the largest layer, never the whole model)."""
    import deepspeed

    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            model._init_weights(module)


def loss_fn(model: torch.nn.Module, window: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy; inputs are window[:, :-1], labels window[:, 1:]."""
    logits = model(input_ids=window[:, :-1]).logits
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1))
