"""The DeepSpeed config dict, derived from the schema (pure: the login node shows it in dry runs).

Batch keys are computed here and nowhere else; `deepspeed.extra` is merged over the rest so users can
reach any DeepSpeed option without the schema knowing it.
"""

from __future__ import annotations

from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common.schema import grad_accumulation, resolved_dtype


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def flops_profiler(train: DictConfig, profile_dir: Optional[str]) -> dict[str, Any]:
    """DeepSpeed's FLOPs profiler on our step N (1-based); DeepSpeed counts completed steps from 0."""
    step = train.flops_profile_step
    section: dict[str, Any] = {
        "enabled": True,
        "profile_step": step - 1,
        "module_depth": -1,
        "top_modules": 3,
        "detailed": True,
    }
    if profile_dir:
        section["output_file"] = f"{profile_dir}/flops_step{step}.txt"
    return section


# Gradient buckets, in elements: one transformer layer's gradients (12 h^2) per bucket, so with
# overlap_comm each layer's reduce runs behind the next layer's backward; at least 2e7 (small models:
# fewer, larger messages), at most DeepSpeed's default 5e8 (the bucket is allocated whole, twice
# with overlap_comm: opt13b 2 x 315M x 2 B = 1.3 GB). planning/ reads them from zero_section.
BUCKET_MIN, BUCKET_MAX, BUCKET_LAYERS = int(2e7), int(5e8), 12


def bucket_elements(hidden_size: int) -> int:
    return int(min(BUCKET_MAX, max(BUCKET_MIN, BUCKET_LAYERS * hidden_size**2)))


def zero_section(cfg: DictConfig) -> dict[str, Any]:
    """The `zero_optimization` section this run trains with (deepspeed.extra merged in): what
    DeepSpeed allocates from, so the planner reads its buckets here too."""
    ds = cfg.deepspeed
    zero: dict[str, Any] = {"stage": ds.stage}
    if ds.stage > 0:
        zero.update(
            # Gradient reduction overlapped with backward (stage 3's default; 1-2 need it asked).
            overlap_comm=True,
            contiguous_gradients=True,
            reduce_bucket_size=bucket_elements(cfg.model.hidden_size),
            allgather_bucket_size=bucket_elements(cfg.model.hidden_size),
        )
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.gpus_per_node > 0}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.gpus_per_node > 0}
    extra = OmegaConf.to_container(ds.extra, resolve=True)
    assert isinstance(extra, dict)
    return _merge(zero, extra.get("zero_optimization") or {})


def build(cfg: DictConfig, world: int, profile_dir: Optional[str] = None) -> dict[str, Any]:
    ds, opt, train = cfg.deepspeed, cfg.optim, cfg.train
    dtype = resolved_dtype(cfg)
    zero = zero_section(cfg)
    config: dict[str, Any] = {
        "train_batch_size": train.global_batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": grad_accumulation(cfg, world),
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "initial_scale_power": 16},
        "gradient_clipping": opt.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": opt.lr,
                "betas": [opt.beta1, opt.beta2],
                "eps": opt.eps,
                "weight_decay": opt.weight_decay,
                # DeepSpeed's fused CPU Adam JIT-compiles for ~70 s on first use; torch's is as good here.
                "torch_adam": True,
            },
        },
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": opt.min_lr,
                "warmup_max_lr": opt.lr,
                "warmup_num_steps": opt.warmup_steps,
                "total_num_steps": max(train.max_steps, 1),
                "warmup_type": "linear",
            },
        },
        "steps_per_print": 10**9,
        # DeepSpeed's timers synchronize the device several times per micro step: off unless asked
        # (train.timers=true: the time split and straggler detection; perf.py mutes their prints).
        "wall_clock_breakdown": bool(train.timers),
        "checkpoint": {"tag_validation": "Fail"},
    }
    if train.flops_profile_step > 0:
        config["flops_profiler"] = flops_profiler(train, profile_dir)
    extra = OmegaConf.to_container(ds.extra, resolve=True)
    assert isinstance(extra, dict)
    return _merge(config, extra)
