"""The DeepSpeed config dict, derived from the schema (pure: the login node shows it in dry runs).

Batch keys are computed here and nowhere else; `deepspeed.extra` is merged over the rest so users can
reach any DeepSpeed option without the schema knowing it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common.derived import grad_accumulation, resolved_dtype, tensor_parallel
from slurmtrain.common.schema import LrDecay, RootConfig, TrainConfig

if TYPE_CHECKING:
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler

Section = dict[str, object]  # a section of DeepSpeed's JSON config


def _merge(base: Section, extra: Mapping[str, object]) -> Section:
    for key, value in extra.items():
        here = base.get(key)
        if isinstance(value, dict) and isinstance(here, dict):
            _merge(here, value)
        else:
            base[key] = value
    return base


def _extra(cfg: RootConfig) -> Section:
    """deepspeed.extra as a plain dict: a DictConfig (login side) or a dict (compute side)."""
    extra = cfg.deepspeed.extra
    data = OmegaConf.to_container(extra, resolve=True) if isinstance(extra, DictConfig) else extra
    assert isinstance(data, dict)
    return {str(key): value for key, value in data.items()}


def flops_profiler(train: TrainConfig, profile_dir: Optional[str]) -> Section:
    """DeepSpeed's FLOPs profiler on our step N (1-based); DeepSpeed counts completed steps from 0."""
    step = train.flops_profile_step
    section: Section = {
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
# ZeRO-3: DeepSpeed's defaults (prefetch 5e7, live 1e9) are 5% and < 1 of an opt66b layer, so each
# layer's all-gather waited on the compute. Prefetch one layer ahead and keep two live (FSDP's
# one-unit prefetch); never below those defaults (small models). Persistent (never partitioned):
# tensors under 10 h elements, the biases and norms (HF's "auto"), not one weight matrix.
PREFETCH_MIN, LIVE_MIN, PERSIST_HIDDEN = int(5e7), int(1e9), 10


def layer_elements(hidden_size: int) -> int:
    """One transformer layer's weights: 4 h^2 attention + 8 h^2 MLP."""
    return BUCKET_LAYERS * hidden_size**2


def bucket_elements(hidden_size: int) -> int:
    return int(min(BUCKET_MAX, max(BUCKET_MIN, layer_elements(hidden_size))))


def stage3_section(hidden_size: int) -> dict[str, int]:
    layer = layer_elements(hidden_size)
    return {
        "stage3_prefetch_bucket_size": max(PREFETCH_MIN, layer),
        "stage3_max_live_parameters": max(LIVE_MIN, 2 * layer),
        "stage3_param_persistence_threshold": PERSIST_HIDDEN * hidden_size,
    }


def zero_section(cfg: RootConfig) -> Section:
    """The `zero_optimization` section this run trains with (deepspeed.extra merged in): what
    DeepSpeed allocates from, so the planner reads its buckets here too."""
    ds = cfg.deepspeed
    zero: Section = {"stage": ds.stage}
    if ds.stage > 0:
        zero.update(
            # Gradient reduction overlapped with backward (stage 3's default; 1-2 need it asked).
            overlap_comm=True,
            contiguous_gradients=True,
            reduce_bucket_size=bucket_elements(cfg.model.hidden_size),
            allgather_bucket_size=bucket_elements(cfg.model.hidden_size),
        )
    if ds.stage == 3:
        zero.update(stage3_section(cfg.model.hidden_size))
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.gpus_per_node > 0}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.gpus_per_node > 0}
    more = _extra(cfg).get("zero_optimization")
    return _merge(zero, more if isinstance(more, dict) else {})


def optimizer(cfg: RootConfig) -> Section:
    """AdamW, stepped by: torch's fused kernel for GPU-resident state (one launch for all
    tensors); DeepSpeedCPUAdam (SIMD, built once by DeepSpeed) for state offloaded to the host;
    torch's plain AdamW on CPU runs (DeepSpeed's CPU Adam JIT-compiles ~70 s on first use)."""
    opt = cfg.optim
    params: Section = {
        "lr": opt.lr,
        "betas": [opt.beta1, opt.beta2],
        "eps": opt.eps,
        "weight_decay": opt.weight_decay,
    }
    if cfg.gpus_per_node == 0:
        params["torch_adam"] = True
    elif not cfg.deepspeed.offload_optimizer:
        # torch_adam: DeepSpeed builds torch.optim.AdamW(**params): `fused` reaches it.
        params.update(torch_adam=True, fused=True)
    return {"type": "AdamW", "params": params}


def precision(cfg: RootConfig, dtype: str) -> Section:
    """bf16 runs accumulate and reduce gradients in fp32, as Megatron (main_grad) and torchtitan
    (FSDP reduce_dtype) do: a bf16 sum over 512 ranks keeps 8 mantissa bits. Costs 2x the bytes of
    the gradient reduction (deepspeed.extra.communication_data_type=bf16 to choose otherwise)."""
    section: Section = {
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "initial_scale_power": 16},
    }
    if dtype == "bf16":
        # The loop's step all-reduce already fails a non-finite loss or gradient norm (and
        # DeepSpeed's -1 for one) and rolls back; DeepSpeed's own bf16 overflow check adds a
        # host sync per step. It stays where ZeRO computes no norm (compute_grad_norm=false).
        zero = _extra(cfg).get("zero_optimization")
        norm = zero.get("compute_grad_norm", True) if isinstance(zero, dict) else True
        section["bf16"] = {"enabled": True, "check_grad_overflow": norm is False}
        section["communication_data_type"] = "fp32"
        # Stages 2-3: DeepSpeed's ZeRO optimizer with an fp32 gradient partition. Not stage 0
        # (DeepSpeed refuses the mix) nor 1 (it would swap in its BF16_Optimizer, another
        # checkpoint layout): there the reduction alone is fp32.
        if cfg.deepspeed.stage >= 2:
            section["data_types"] = {"grad_accum_dtype": "fp32"}
    return section


def lr_at(
    k: int, peak: float, floor: float, warmup: int, total: int, decay: str = "linear"
) -> float:
    """The learning rate of update k + 1 (k updates applied before it): metaseq's polynomial_decay
    (power 1) at num_updates = k + 1: linear from 0 to `peak` over `warmup` updates (the first at
    peak / warmup, never a no-op), then linear to `floor` at update `total`, then `floor`."""
    n = k + 1
    if warmup > 0 and n <= warmup:
        return peak * n / warmup
    if n >= total:
        return floor
    done = (n - warmup) / (total - warmup)
    if decay == "cosine":  # half a cosine from peak to floor (Llama's schedule)
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * done))
    return floor + (peak - floor) * (1 - done)


def lr_scheduler(cfg: RootConfig) -> Callable[[Optimizer], LRScheduler]:
    """`deepspeed.initialize(lr_scheduler=...)`: DeepSpeed calls it with the torch optimizer and
    steps the scheduler after every applied update (not after an fp16 overflow). Its state is the
    update count only, so a resumed run follows the config's schedule; a checkpoint written with
    DeepSpeed's WarmupDecayLR ({'last_batch_iteration'}) resumes at the same update."""
    o = cfg.optim
    assert o.min_lr is not None and o.warmup_steps is not None and cfg.train.max_steps is not None
    peak, floor, warmup = float(o.lr), float(o.min_lr), int(o.warmup_steps)
    total = max(int(cfg.train.max_steps), 1)
    # A loaded optimizer's groups hold the saved run's betas, eps and decay too (follow_config).
    ours = {
        "betas": (float(o.beta1), float(o.beta2)),
        "eps": float(o.eps),
        "weight_decay": float(o.weight_decay),
    }

    def factor(k: int) -> float:  # a function, not an object: torch saves no state for it
        return lr_at(k, peak, floor, warmup, total, str(getattr(o, "decay", LrDecay.linear))) / peak

    def make(optimizer: Optimizer) -> LRScheduler:
        from torch.optim.lr_scheduler import LambdaLR

        class Schedule(LambdaLR):  # type: ignore[misc]  # torch is not followed by mypy
            def load_state_dict(self, state: dict[str, object]) -> None:
                if "last_epoch" not in state and "last_batch_iteration" in state:
                    done = state["last_batch_iteration"]
                    assert isinstance(done, (int, float))
                    self.last_epoch = int(done) + 1
                else:
                    super().load_state_dict(state)
                self.follow_config()

            def follow_config(self) -> None:
                """The config's peak at the loaded update count: a checkpoint's saved base_lrs
                and group lr are another config's when a branch (resume_from) changed optim.lr.
                Called again after DeepSpeed loads the optimizer, whose groups it restores."""
                self.base_lrs = [peak for _ in self.optimizer.param_groups]
                self._last_lr = [base * factor(self.last_epoch) for base in self.base_lrs]
                for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                    group["lr"], group["initial_lr"] = lr, peak
                    group.update({k: v for k, v in ours.items() if k in group})

        return Schedule(optimizer, factor)

    return make


def build(cfg: RootConfig, world: int, profile_dir: Optional[str] = None) -> Section:
    """DeepSpeed's config; the learning-rate schedule is `lr_scheduler(cfg)`, passed beside it
    (DeepSpeed's WarmupDecayLR starts the warm-up at its floor and cannot decay to another)."""
    opt, train = cfg.optim, cfg.train
    dtype = resolved_dtype(cfg)
    zero = zero_section(cfg)
    config: Section = {
        "train_batch_size": train.global_batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": grad_accumulation(cfg, world),
        "zero_optimization": zero,
        **precision(cfg, dtype),
        "gradient_clipping": opt.grad_clip,
        "optimizer": optimizer(cfg),
        "steps_per_print": 10**9,
        # DeepSpeed's timers synchronize the device several times per micro step: off unless asked
        # (train.timers=true: the time split and straggler detection; perf.py mutes their prints).
        "wall_clock_breakdown": bool(train.timers),
        "checkpoint": {"tag_validation": "Fail"},
    }
    if tensor_parallel(cfg) > 1:
        # DeepSpeed AutoTP shards the model inside deepspeed.initialize. The output head stays
        # whole (not vocabulary-parallel): model.loss_fn computes the loss from full logits.
        config["tensor_parallel"] = {
            "autotp_size": tensor_parallel(cfg),
            "vocab_parallel_lm_head": False,
        }
    if train.flops_profile_step > 0:
        config["flops_profiler"] = flops_profiler(train, profile_dir)
    return _merge(config, _extra(cfg))
