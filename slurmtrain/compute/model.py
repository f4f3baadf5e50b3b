"""The model, built from config with transformers' classes: nothing is downloaded.

OPT (model.family=opt) through OPTConfig; any other family through its transformers config
(common/hf_config.py `family_config`: model=hf builds from the run directory's copy of the
config.json, typed as transformers wrote it) and the causal LM class transformers maps it to.
Weights ~ N(0, model.init_std); with model.scaled_init the residual branches' output projections
get init_std / sqrt(2 * num_layers) (metaseq's OPT init), so the residual stream's variance does
not grow with depth.

ZeRO 0-2 build on the rank's device in the training dtype (never a whole fp32 copy per rank);
ZeRO-3 builds under `deepspeed.zero.Init`, or loads `model.pretrained_path` with `HfDeepSpeedConfig`
alive (transformers partitions each tensor as it loads). Attention: model.attn_implementation
(auto: PyTorch's SDPA where the family's class supports it, else eager; hf_config.attention);
the loss never makes a full-vocabulary fp32 copy of 16-bit logits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Union

import torch

from slurmtrain.common.hf_config import attention, family_config
from slurmtrain.common.schema import RootConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

DsConfig = Mapping[str, object]  # the DeepSpeed config dict (common/ds_config.py)


def opt_config(cfg: RootConfig) -> PretrainedConfig:
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
        attn_implementation=attention(m),  # auto: SDPA (fused attention)
        # No padding id: we never pad, and zeroing its embedding row fails on ZeRO-3 partitions.
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
    )


def model_config(cfg: RootConfig) -> PretrainedConfig:
    """The transformers config of the run's model: OPTConfig for OPT, else family_config."""
    return opt_config(cfg) if cfg.model.family == "opt" else family_config(cfg.model)


def model_class(cfg: RootConfig) -> type[PreTrainedModel]:
    """The causal LM class transformers maps the run's config to (OPTForCausalLM for OPT)."""
    from transformers import OPTForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls: type[PreTrainedModel] = (
        OPTForCausalLM
        if cfg.model.family == "opt"
        else MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config(cfg))]
    )
    return cls


def train_dtype(ds_config: DsConfig) -> torch.dtype:
    """The dtype DeepSpeed trains the module in (bf16/fp16 sections of the DeepSpeed config)."""
    if _enabled(ds_config.get("bf16")):
        return torch.bfloat16
    if _enabled(ds_config.get("fp16")):
        return torch.float16
    return torch.float32


def _enabled(section: object) -> bool:
    return isinstance(section, Mapping) and bool(section.get("enabled"))


def build(
    cfg: RootConfig,
    ds_config: DsConfig,
    device: Union[str, torch.device] = "cpu",
    mpu: object = None,
) -> torch.nn.Module:
    """ZeRO-3: no rank ever holds the whole model. ZeRO 0-2: built on `device` in the training
    dtype (the seed is set first: the same config draws the same weights). `mpu`: TP's or SP's
    groups (compute/parallel.mpu, set up by the caller before zero.Init: its patched tensor
    construction refuses torch._dynamo's import), so ZeRO-3 partitions over the data-parallel
    ranks."""
    torch.manual_seed(cfg.train.seed)
    device = torch.device(device)
    dtype = train_dtype(ds_config)
    if cfg.model.pretrained_path:
        model = _pretrained(cfg, ds_config, device, dtype)
    elif cfg.deepspeed.stage == 3:
        import deepspeed

        cls, config = model_class(cfg), model_config(cfg)
        with deepspeed.zero.Init(config_dict_or_path=ds_config, mpu=mpu):
            model = cls(config)
    else:
        model = _fresh(cfg, device, dtype)
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


def _fresh(cfg: RootConfig, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A new model allocated (and initialised) directly on `device` in `dtype`."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            return model_class(cfg)(model_config(cfg))
    finally:
        torch.set_default_dtype(previous)


def _pretrained(
    cfg: RootConfig, ds_config: DsConfig, device: torch.device, dtype: torch.dtype
) -> torch.nn.Module:
    """`model.pretrained_path` (an export or any local folder of the run's family), in the training
    dtype. ZeRO-3: `HfDeepSpeedConfig` makes `from_pretrained` load into the partitions (a bare
    zero.Init around it would load into empty ones)."""
    path = cfg.model.pretrained_path
    # This run's dropout, not the source's (from_pretrained applies these to its config).
    kwargs: dict[str, object] = dict(
        local_files_only=True,
        dtype=dtype,
        attn_implementation=attention(cfg.model),
        use_cache=False,
    )
    if cfg.model.family == "opt":
        kwargs.update(
            dropout=cfg.model.dropout,
            attention_dropout=cfg.model.dropout,
            activation_dropout=0.0,
            layerdrop=0.0,
        )
    elif cfg.model.dropout:
        kwargs.update(attention_dropout=cfg.model.dropout)
    cls = model_class(cfg)
    if cfg.deepspeed.stage == 3:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig

        keep = HfDeepSpeedConfig(ds_config)  # transformers holds a weak reference: keep it alive
        try:
            model = cls.from_pretrained(path, **kwargs)
        finally:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            del keep
        return model
    return cls.from_pretrained(path, **kwargs).to(device)


def scaled_std(cfg: RootConfig) -> float:
    """The output projections' std: init_std / sqrt(2 * num_layers) (0.006 -> 0.00067 for 40 layers)."""
    return cfg.model.init_std / math.sqrt(2 * cfg.model.num_layers)


def output_projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The Linear layers that write into the residual stream: each layer's attention output and
    its last MLP matrix (2 per layer): OPT's out_proj and fc2, Llama-shaped o_proj and down_proj."""
    return [
        m
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.endswith(RESIDUAL_OUTPUTS)
    ]


# Names (suffixes) of the residual branches' output projections, by family: OPT, Llama-shaped,
# GPT-NeoX. A family with none of these gets transformers' own init unscaled.
RESIDUAL_OUTPUTS = (
    "self_attn.out_proj",
    ".fc2",
    "self_attn.o_proj",
    "mlp.down_proj",
    "attention.dense",
    "mlp.dense_4h_to_h",
)


def _init_partitioned(model: torch.nn.Module, scaled: float | None = None) -> None:
    """Hugging Face's init ran on ZeRO-3's empty partitions: redo it one module at a time (memory:
    the largest layer), rank 0 initialising and DeepSpeed re-partitioning its values to all."""
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


# Tokens per chunk of the 16-bit loss: it holds chunk x vocab fp32 values at a time, not b*s x vocab
LOSS_CHUNK_TOKENS = 4096


def loss_fn(model: torch.nn.Module, window: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy; inputs are window[:, :-1], labels window[:, 1:]. 16-bit logits:
    summed over token chunks, each upcast to fp32 inside a checkpointed function."""
    logits = model(input_ids=window[:, :-1]).logits
    flat = logits.reshape(-1, logits.size(-1))
    labels = window[:, 1:].reshape(-1)
    if flat.dtype == torch.float32:
        return torch.nn.functional.cross_entropy(flat, labels)
    from torch.utils.checkpoint import checkpoint

    total = flat.new_zeros((), dtype=torch.float32)
    for i in range(0, flat.size(0), LOSS_CHUNK_TOKENS):
        piece = slice(i, i + LOSS_CHUNK_TOKENS)
        total = total + checkpoint(_ce_sum, flat[piece], labels[piece], use_reentrant=False)
    return total / flat.size(0)


def _ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token fp32 cross entropy, shaped as `labels` (sequence parallelism sums a slice's);
    16-bit logits in checkpointed chunks, as loss_fn, so no full fp32 copy is kept."""
    flat, target = logits.reshape(-1, logits.size(-1)), labels.reshape(-1)
    if flat.dtype == torch.float32:
        out = torch.nn.functional.cross_entropy(flat, target, reduction="none")
        return out.view(labels.shape)
    from torch.utils.checkpoint import checkpoint

    pieces = [
        checkpoint(
            _ce,
            flat[i : i + LOSS_CHUNK_TOKENS],
            target[i : i + LOSS_CHUNK_TOKENS],
            use_reentrant=False,
        )
        for i in range(0, flat.size(0), LOSS_CHUNK_TOKENS)
    ]
    return torch.cat(pieces).view(labels.shape)


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")


def params_finite(module: torch.nn.Module, device: torch.device) -> bool:
    """Every rank's parameters (its ZeRO-3 partition) are finite: one pass, one all-reduce (a
    save refuses non-finite weights: nothing non-finite is ever published)."""
    import torch.distributed as dist

    by_device: dict[torch.device, list[torch.Tensor]] = {}  # offloaded partitions: on the host
    for p in module.parameters():
        t = getattr(p, "ds_tensor", p)
        if t.numel():
            by_device.setdefault(t.device, []).append(torch.isfinite(t).all())
    bad = torch.zeros(1, dtype=torch.float64, device=device)
    for flags in by_device.values():
        bad += torch.stack(flags).logical_not().any().to(device, torch.float64)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bool(bad.item() == 0)
