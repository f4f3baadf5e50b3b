"""Checks Hydra's types cannot express: batch math, ranges, files, ZeRO/offload, the recipe's tokens.

Each failure is one ConfigError line naming the key, the value and the fix. `validate_config` runs
on the login node before anything is written or queued; the planner shares the ZeRO and sequence
checks. Closed choices are Enums in the schema, refused at compose time (common/hydra_errors.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re

from slurmtrain.common.derived import data_parallel, grad_accumulation, node_range, world_size
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import (
    DERIVED_DEEPSPEED_KEYS,
    ClusterKind,
    Container,
    FaultsConfig,
    ModelConfig,
    RootConfig,
    TrainConfig,
)
from slurmtrain.common.validation_data import check_data, check_positive
from slurmtrain.common.validation_login import check_all
from slurmtrain.common.validation_parallel import check_parallel
from slurmtrain.planning import policy
from slurmtrain.planning.deadlines import MARGIN_FRACTION, MARGIN_S


def _value(cfg: RootConfig, key: str) -> object:
    """The value at dotted `key`, by attribute: a DictConfig and a RootConfig alike."""
    return functools.reduce(getattr, key.split("."), cfg)


# key, lowest value, whether that lowest value itself is allowed, what 0/-1 mean, an example.
# Hydra's types have already made each an int or a float; these are the ranges that make sense.
_RANGES: tuple[tuple[str, float, bool, str, str], ...] = (
    ("optim.lr", 0, False, "", "3e-4"),
    ("optim.eps", 0, False, "", "1e-8"),
    ("optim.weight_decay", 0, True, "", "0.1"),
    ("optim.grad_clip", 0, True, " (0: no clipping)", "1.0"),
    ("data.max_corpus_bytes", 1, True, "", "4000000"),
    ("data.skip_samples", 0, True, " (samples skipped at a branch point)", "51200"),
    ("checkpoint.interval_steps", 0, True, " (0: never by steps; auto: planned)", "25"),
    ("checkpoint.interval_minutes", 0, True, " (0: never by time)", "30"),
    ("checkpoint.keep_every", 0, True, " (0: none kept forever)", "1000"),
    ("checkpoint.publish_timeout_minutes", 0, False, "", "30"),
    ("checkpoint.local_every_steps", 0, True, " (0: no node-local tier; auto: planned)", "50"),
    ("cluster.signal_lead_s", 1, True, " (seconds of warning before the time limit)", "120"),
    ("cluster.array_parallelism", 1, True, " (sweep points running at once)", "16"),
    ("cluster.gpu_mem_gb", 0, False, " (GiB as the card reports it; auto: the card's)", "79.1"),
    ("faults.crash_loop", 0, True, " (0: off)", "2"),
    ("faults.max_no_progress_attempts", 0, True, " (0: off)", "3"),
    ("faults.node_check_s", 0, True, " (0: this cluster's SlurmdTimeout + 30 s)", "330"),
    ("faults.collective_timeout_s", 0, False, "", "1800"),
    ("faults.health_slow_factor", 1, False, " (times the median node's time)", "5"),
    ("faults.skip_batches", 0, True, "", "200"),
    ("faults.rollback_repeat_window", 0, True, " (0: never deeper)", "500"),
    ("faults.spike_window", 1, True, "", "50"),
    ("faults.hang_timeout_s", 0, False, "", "600"),
    ("faults.startup_timeout_s", 0, False, "", "1800"),
    ("faults.io_floor_s", 0, False, "", "300"),
    ("faults.io_write_mb_per_s", 0, False, "", "1000"),
    ("faults.io_read_mb_per_s", 0, False, "", "2000"),
    ("faults.io_safety", 1, True, " (times the expected IO time)", "3"),
    ("faults.node_mtbf_h", 0, False, " (hours between failures of one node)", "6334"),
)
# "auto" until planned (planning/policy.py, planning/cards.py)
_AUTO_KEYS = ("checkpoint.interval_steps", "checkpoint.local_every_steps", "cluster.gpu_mem_gb")


def _in_range(
    key: str, value: object, low: float, inclusive: bool, means: str, example: str
) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if value >= low if inclusive else value > low:
            return
    rule = f"{'>=' if inclusive else '>'} {low}"
    raise ConfigError(f"{key}={value!r}: must be a number {rule}{means}; e.g. {key}={example}")


def _ranges(cfg: RootConfig) -> None:
    """Numbers in their ranges: the table above, the failure budgets, betas, exclusion hours."""
    for key, low, inclusive, means, example in _RANGES:
        value = _value(cfg, key)
        if not (key in _AUTO_KEYS and value == "auto"):
            _in_range(key, value, low, inclusive, means, example)
    budgets = (f.name for f in dataclasses.fields(FaultsConfig) if f.name.startswith("max_"))
    for key in budgets:
        _in_range(f"faults.{key}", getattr(cfg.faults, key), -1, True, " (-1: unlimited)", "3")
    for beta, typical in (("optim.beta1", 0.9), ("optim.beta2", 0.95)):
        value = _value(cfg, beta)
        if not (isinstance(value, (int, float)) and 0 <= value < 1):
            raise ConfigError(f"{beta}={value!r}: must be >= 0 and < 1; e.g. {beta}={typical}")
    hours = cfg.faults.exclude_hours
    if not (math.isfinite(hours) and (hours >= 0 or hours == -1)):
        raise ConfigError(
            f"faults.exclude_hours={hours!r}: must be >= 0 (hours a failed node stays excluded) "
            f"or -1 (never expires); e.g. faults.exclude_hours=24"
        )
    for key in ("cluster.mem", "cluster.mem_per_gpu"):
        value = _value(cfg, key)
        if value is not None and not re.fullmatch(r"[0-9]+[KMGTkmgt]?", str(value)):
            raise ConfigError(
                f"{key}={value!r}: not a Slurm memory size; use a whole number with an optional "
                f"K, M, G or T suffix (megabytes without one); e.g. {key}=64G"
            )


def check_timeout_order(faults: FaultsConfig) -> None:
    """compute/distributed.py's rule: a stuck step passes hang_timeout_s, the watchdog dumps its
    stacks within the margin, only then may a collective time out (start-up is lifted at run time)."""
    hang, collective = float(faults.hang_timeout_s), float(faults.collective_timeout_s)
    least = hang + max(MARGIN_S, MARGIN_FRACTION * hang)
    if collective < least:
        raise ConfigError(
            f"faults.collective_timeout_s={faults.collective_timeout_s!r} with "
            f"faults.hang_timeout_s={faults.hang_timeout_s!r}: a collective would time out before "
            f"the hang watchdog (it needs hang_timeout_s + {least - hang:g} s); set "
            f"faults.collective_timeout_s={math.ceil(least)} or lower faults.hang_timeout_s"
        )


DEFAULT_MAX_STEPS = 200  # the tiny demo's length when neither max_steps nor tokens is given
DEFAULT_WARMUP_STEPS = 10


def _per_tokens(key: str, tokens: object, per: int) -> int:
    """A token budget as whole `per`-token steps, rounded down as metaseq does (at least 1)."""
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens <= 0:
        raise ConfigError(f"{key}={tokens!r}: must be a positive number of tokens; e.g. {key}=3e11")
    return max(1, int(tokens) // per)


def resolve_batch(cfg: RootConfig) -> None:
    """Fill in what was left to be derived (login node, before hashing): the global batch (from
    tokens or from micro x accumulation x world), the run length and warm-up (steps from tokens),
    and the decay floor (a fraction of the peak lr)."""
    t, o = cfg.train, cfg.optim
    if t.global_batch_size is None and t.global_batch_tokens is not None:
        check_positive("data.seq_len", cfg.data.seq_len)
        tokens = t.global_batch_tokens
        if (
            isinstance(tokens, bool)
            or not isinstance(tokens, (int, float))
            or tokens <= 0
            or int(tokens) != tokens
            or int(tokens) % cfg.data.seq_len
        ):
            raise ConfigError(
                f"train.global_batch_tokens={tokens:g}: must be a whole number of "
                f"sequences of data.seq_len={cfg.data.seq_len} tokens; e.g. "
                f"train.global_batch_tokens={cfg.data.seq_len * 256}"
            )
        t.global_batch_size = int(tokens) // cfg.data.seq_len
    if t.global_batch_size is None:
        check_positive("train.micro_batch_size", t.micro_batch_size)
        check_positive("train.grad_accumulation", t.grad_accumulation)
        world = world_size(cfg)
        t.global_batch_size = t.micro_batch_size * t.grad_accumulation * data_parallel(cfg, world)
    check_positive("train.global_batch_size", t.global_batch_size)
    step_tokens = t.global_batch_size * cfg.data.seq_len
    if t.max_steps is None:
        t.max_steps = (
            _per_tokens("train.tokens", t.tokens, step_tokens)
            if t.tokens is not None
            else DEFAULT_MAX_STEPS
        )
    if o.warmup_steps is None:
        o.warmup_steps = (
            _per_tokens("optim.warmup_tokens", o.warmup_tokens, step_tokens)
            if o.warmup_tokens is not None
            else DEFAULT_WARMUP_STEPS
        )
    if o.warmup_steps < 0:
        raise ConfigError(
            f"optim.warmup_steps={o.warmup_steps}: must be >= 0; e.g. optim.warmup_steps=10"
        )
    if o.min_lr is None:
        if not 0 < o.min_lr_ratio <= 1:
            raise ConfigError(
                f"optim.min_lr_ratio={o.min_lr_ratio}: must be in (0, 1] (the "
                f"decay floor as a fraction of optim.lr); e.g. optim.min_lr_ratio=0.1"
            )
        o.min_lr = o.lr * o.min_lr_ratio
    if not 0 < o.min_lr <= o.lr:
        raise ConfigError(
            f"optim.min_lr={o.min_lr}: must be > 0 and <= optim.lr={o.lr} "
            f"(the floor the decay ends at); e.g. optim.min_lr={o.lr / 10:g}"
        )


def validate_config(cfg: RootConfig, submitting: bool = True) -> None:
    """Every check Hydra's types cannot do; the first failure raises one ConfigError line.

    A dry run plans any size (`model=opt13b nodes=64` on a laptop); only a real submission needs a
    backend that can place it. The order matters (the first failure is the one reported): what
    the run is, its numbers, what is derived from them, then the checks that read the derived.
    """
    _check_placed_and_named(cfg)
    _ranges(cfg)
    check_timeout_order(cfg.faults)
    check_parallel(cfg)  # before the batch arithmetic, which divides the world by it
    resolve_batch(cfg)
    policy.resolve_time(cfg, None, "not read from Slurm")  # placement.py had no partition
    policy.resolve_checkpoint(cfg)
    check_all(cfg)  # unknown keys, cluster.* for every kind, runs_root, run_dir_mode
    _check_train_steps(cfg)  # after resolve_batch: train.max_steps is known only then
    _check_slurm_only(cfg, submitting)
    _check_faults(cfg, submitting)
    _check_model_and_data(cfg, submitting)


def _check_placed_and_named(cfg: RootConfig) -> None:
    """cluster.kind and gpus_per_node resolved to real values; the name usable as a path."""
    if cfg.gpus_per_node == "auto" or cfg.cluster.kind == ClusterKind.auto:
        raise ConfigError(
            "cluster.kind/gpus_per_node=auto: not resolved; the launch flow calls "
            "slurmtrain.login.placement.resolve_auto first (or set them explicitly)"
        )
    if (
        isinstance(cfg.gpus_per_node, bool)
        or not isinstance(cfg.gpus_per_node, int)
        or cfg.gpus_per_node < 0
    ):
        raise ConfigError(
            f"gpus_per_node={cfg.gpus_per_node!r}: must be auto or an integer >= 0 "
            f"(0 means CPU); e.g. gpus_per_node=8"
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", str(cfg.name)):
        raise ConfigError(
            f"name={cfg.name!r}: a run name is a directory and a job name; use "
            f"letters, digits and ._- (e.g. name=opt13b-lr3e-4)"
        )


# Counts and sizes that have no meaningful zero once the batch is resolved.
_POSITIVE_KEYS = (
    "train.max_steps",
    "train.micro_batch_size",
    "train.global_batch_size",
    "train.log_interval",
    "data.seq_len",
    "model.num_layers",
    "model.hidden_size",
    "model.num_heads",
    "cluster.cpu_tasks_per_node",
    "checkpoint.keep_last",
)


def _check_train_steps(cfg: RootConfig) -> None:
    """Positive counts, the one-off steps inside the run, the straggler and pause settings."""
    for key in _POSITIVE_KEYS:
        check_positive(key, _value(cfg, key))
    for key, example in (("train.flops_profile_step", 10), ("train.memory_check_step", 3)):
        value = _value(cfg, key)
        if not (isinstance(value, int) and 0 <= value <= (cfg.train.max_steps or 0)):
            raise ConfigError(
                f"{key}={value}: must be 0 (off) or a step up to train.max_steps="
                f"{cfg.train.max_steps}; e.g. {key}={example}"
            )
    if cfg.train.straggler_factor != TrainConfig.straggler_factor:  # kept for earlier runs' files
        raise ConfigError(
            f"train.straggler_factor={cfg.train.straggler_factor}: no longer read (stragglers are "
            f"scored by the section clocks, compute/observe/stragglers.py); set "
            f"faults.straggler_threshold={cfg.train.straggler_factor} instead"
        )
    if cfg.train.pause_at_step < 0:
        raise ConfigError(
            f"train.pause_at_step={cfg.train.pause_at_step}: must be 0 (never) or a "
            f"step; e.g. train.pause_at_step=10"
        )


def _check_slurm_only(cfg: RootConfig, submitting: bool) -> None:
    """Smoke jobs and staged environments are batch-script features: Slurm only, no container."""
    if submitting and cfg.smoke and cfg.cluster.kind != "slurm":
        raise ConfigError(
            f"smoke=true: chains a smoke job before the real one on Slurm; use "
            f"cluster=slurm (cluster.kind is '{cfg.cluster.kind}') or smoke=false"
        )
    if cfg.cluster.stage_env and cfg.cluster.container != Container.none:
        raise ConfigError(
            f"cluster.stage_env=true with cluster.container={cfg.cluster.container}: the image is "
            f"the environment (stage the image instead); set cluster.stage_env=false"
        )
    if submitting and cfg.cluster.stage_env and cfg.cluster.kind != "slurm":
        raise ConfigError(
            f"cluster.stage_env=true: the batch script stages the environment on Slurm nodes; use "
            f"cluster=slurm (cluster.kind is '{cfg.cluster.kind}') or cluster.stage_env=false"
        )
    if cfg.cluster.stage_env and not str(cfg.cluster.stage_env_dir).startswith("/"):
        raise ConfigError(
            f"cluster.stage_env_dir={cfg.cluster.stage_env_dir!r}: must be an absolute node-local "
            f"directory; e.g. cluster.stage_env_dir=/tmp"
        )


def _check_faults(cfg: RootConfig, submitting: bool) -> None:
    """What a restart resumes from, the spare nodes it may use, the loss-spike trigger."""
    if not re.fullmatch(r"auto|none|step_\d+", str(cfg.resume)):
        raise ConfigError(
            f"resume={cfg.resume!r}: must be auto (newest valid checkpoint), none (start from "
            f"step 0) or step_N (that checkpoint); e.g. resume=step_1000"
        )
    spares = cfg.faults.spare_nodes
    if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
        raise ConfigError(
            f"faults.spare_nodes={spares!r}: must be a whole number >= 0 (nodes held beside "
            f"`nodes` for in-allocation restarts); e.g. faults.spare_nodes=1"
        )
    if submitting and spares and cfg.cluster.kind != "slurm":
        raise ConfigError(
            f"faults.spare_nodes={spares}: spares are extra Slurm nodes of the job; use "
            f"cluster=slurm (cluster.kind is '{cfg.cluster.kind}') or faults.spare_nodes=0"
        )
    if cfg.faults.spike_factor != 0 and cfg.faults.spike_factor <= 1:
        raise ConfigError(
            f"faults.spike_factor={cfg.faults.spike_factor}: must be 0 (off) or > 1 (times the "
            f"running median loss); e.g. faults.spike_factor=3"
        )


def _check_model_and_data(cfg: RootConfig, submitting: bool) -> None:
    """ZeRO, the model's shape, the data, and that every node count in the range divides."""
    low, high = node_range(cfg.nodes)
    ds = cfg.deepspeed
    check_zero(ds.stage, ds.offload_optimizer, ds.offload_param)
    for key in DERIVED_DEEPSPEED_KEYS:
        if key in cfg.deepspeed.extra:
            raise ConfigError(
                f"deepspeed.extra.{key}: derived from train.micro_batch_size and "
                f"train.global_batch_size; set those instead"
            )
    if cfg.model.hidden_size % cfg.model.num_heads and not cfg.model.hf_extra.get("head_dim"):
        raise ConfigError(
            f"model.num_heads={cfg.model.num_heads}: must divide model.hidden_size="
            f"{cfg.model.hidden_size}"
        )
    check_family(cfg.model)
    check_data(cfg)
    check_seq_len(cfg.data.seq_len, cfg.model.max_positions)
    if submitting and cfg.cluster.kind == "local" and high != 1:
        raise ConfigError(
            f"nodes={cfg.nodes!r}: the local executor runs on this machine only; "
            f"use nodes=1 or cluster=slurm"
        )
    # the smallest and the largest world of the range: the global batch must divide over both
    for n in sorted({low, high}):
        grad_accumulation(cfg, world_size(cfg, n))
    if cfg.model.pretrained_path and not os.path.isdir(cfg.model.pretrained_path):
        raise ConfigError(
            f"model.pretrained_path={cfg.model.pretrained_path!r}: not a directory; "
            f"point it at a local Hugging Face model folder"
        )


def check_family(m: ModelConfig) -> None:
    """model.family is a causal LM transformers ships; num_kv_heads divides num_heads (GQA)."""
    kv = m.num_kv_heads
    if kv is not None and (kv < 1 or m.num_heads % kv):
        raise ConfigError(
            f"model.num_kv_heads={kv}: must divide model.num_heads={m.num_heads} (GQA groups; "
            f"1 is MQA); e.g. model.num_kv_heads={max(1, m.num_heads // 4)}"
        )
    if m.family in ("opt", "llama", "mistral", "qwen2"):
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if m.family not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"model.family={m.family!r}: not a causal LM transformers ships; use a shipped model "
            f"(model=llama_tiny) or model=hf model.config=DIR with a decoder's config.json"
        )


def check_zero(stage: int, offload_optimizer: bool, offload_param: bool) -> None:
    """What DeepSpeed accepts of ZeRO stage and offload; shared by validate and the planner."""
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"deepspeed.stage={stage}: ZeRO stages are 0-3; e.g. deepspeed=zero2")
    if offload_param and stage != 3:
        raise ConfigError(
            f"deepspeed.offload_param=true: needs ZeRO-3 (stage is {stage}); "
            f"use deepspeed=zero3_offload"
        )
    if offload_optimizer and stage == 0:
        raise ConfigError(
            "deepspeed.offload_optimizer=true: needs ZeRO stage >= 1; use deepspeed=zero1 or higher"
        )
    if offload_param and not offload_optimizer:
        raise ConfigError(
            "deepspeed.offload_param=true: DeepSpeed offloads params only together "
            "with the optimizer; use deepspeed=zero3_offload"
        )


def check_seq_len(seq_len: int, max_positions: int) -> None:
    if seq_len > max_positions:
        raise ConfigError(
            f"data.seq_len={seq_len}: above model.max_positions={max_positions}; "
            f"use data.seq_len<={max_positions}"
        )
