"""The one typed config schema both worlds share, and its validation.

Dataclasses are registered with Hydra's ConfigStore so that Hydra type-checks every override; the
checks Hydra cannot express (batch divisibility, ranges, files that must exist) live in `validate`,
which raises `ConfigError` with one line naming the key, the value and the fix. Nothing here imports
torch: the login node composes and validates in well under a second.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from slurmtrain.common.errors import ConfigError

# Batch keys are derived from train.*; a user passing them through deepspeed.extra would silently
# disagree with the sampler, so they are refused.
DERIVED_DEEPSPEED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
)


@dataclass
class ModelConfig:
    name: str = MISSING
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_heads: int = MISSING
    ffn_dim: int = MISSING
    vocab_size: int = 50272
    max_positions: int = 2048
    word_embed_proj_dim: Optional[int] = None
    layer_norm_before: bool = True
    dropout: float = 0.0  # residual and attention dropout (OPT recipe: 0.1)
    # Weights ~ N(0, init_std) (transformers' OPT init); scaled_init: the residual-branch output
    # projections (attention out_proj, fc2) get init_std / sqrt(2 * num_layers), as metaseq's
    # --full-megatron-init does, so the residual stream's variance does not grow with depth.
    init_std: float = 0.02
    scaled_init: bool = False
    activation_checkpointing: bool = False
    pretrained_path: Optional[str] = None  # a local Hugging Face directory; nothing is downloaded


@dataclass
class DataConfig:
    kind: str = "synthetic"  # synthetic: stdlib text as bytes, on every machine | tokens: a .bin file
    path: Optional[str] = None  # tokens: the .bin written by tools/prepare_data.py
    seq_len: int = 128
    max_corpus_bytes: int = 4_000_000  # synthetic: how much stdlib source to gather
    seed: int = 1234  # shuffling order of the samples


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3  # peak
    # Linear warm-up to `lr`, then linear decay to min_lr at the last step (WarmupDecayLR).
    # None: min_lr_ratio x lr (OPT: 10% of peak). Must be > 0: warmup_min_lr=0 makes the first
    # updates no-ops.
    min_lr: Optional[float] = None
    min_lr_ratio: float = 0.1
    # warmup_steps wins when set; else warmup_tokens / tokens per step; else DEFAULT_WARMUP_STEPS.
    warmup_steps: Optional[int] = None
    warmup_tokens: Optional[float] = None
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0


@dataclass
class DeepSpeedConfig:
    stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False
    dtype: str = "auto"  # auto: bf16 on GPUs, fp32 on CPUs | bf16 | fp16 | fp32
    extra: dict[str, Any] = field(default_factory=dict)  # passed through to the DeepSpeed config


@dataclass
class CheckpointConfig:
    interval_steps: int = 25  # 0: never by steps
    interval_minutes: float = 0.0  # 0: never by time; both set: whichever comes first
    keep_last: int = 3
    keep_every: int = 0  # also keep every Nth step forever (0: none)
    verify: str = "checksum"  # checksum: CRC-32 of every file (checkpoint.CHECKSUM) | size: sizes only
    # Block the loop only for the copy of the state to host memory (2x host memory for the state);
    # files, fsync, manifest and publish happen in a background thread per rank.
    async_save: bool = False
    on_save_error: str = "continue"  # a failed save (disk full...): continue (retry next) | stop
    publish_timeout_minutes: float = 30.0  # async: rank 0 gives up on a rank's files after this


@dataclass
class ClusterConfig:
    kind: str = "local"  # auto (Slurm when it answers, else local) | local | slurm
    cpu_tasks_per_node: int = 2  # tasks per node when gpus_per_node == 0
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: str = "01:00:00"
    # None: on Slurm GPU runs the node's cores per GPU (partition CPUs / GPUs), else 1; passed to
    # srun too (Slurm 22.05-23.02 srun does not inherit it) with --cpu-bind=cores.
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None  # --mem per node; set it or mem_per_gpu
    mem_per_gpu: Optional[str] = None  # None on Slurm GPU runs: the node's memory over its GPUs
    cpu_bind: str = "cores"  # srun --cpu-bind (none: leave binding to the site)
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    exclusive: bool = False
    signal_lead_s: int = 120
    array_parallelism: int = 16  # %N throttle of a sweep's job array
    gpu_type: str = "H100"  # for the plan's peak TFLOPS and ETA when nothing was measured yet
    gpu_mem_gb: float = 80.0  # what the memory plan must fit into, per GPU
    cpu_mem_gb: Optional[float] = None  # host memory per node (checked for offload plans)
    container: str = "none"  # none | apptainer | pyxis
    image: Optional[str] = None
    sbatch_extra: dict[str, Any] = field(default_factory=dict)
    srun_extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class FaultsConfig:
    # Failure budgets across all attempts of a run (-1: unlimited). Past one, the run stops with its
    # class and last error in `status` instead of being requeued again.
    max_preempted: int = -1
    max_timed_out: int = 1000
    max_node_failure: int = 20
    max_hang: int = 5
    max_crash: int = 3
    max_config_error: int = 0
    crash_loop: int = 2  # this many crashes in a row at the same step: stop, it will not heal
    hang_timeout_s: float = 600.0  # no step progress for this long: dump stacks, exit, requeue
    collective_timeout_s: float = 1800.0  # NCCL/gloo timeout; keep above hang_timeout_s
    health_check: bool = True  # devices, a checked matmul and a timed all-reduce before loading
    health_slow_factor: float = 5.0  # a node this much slower than the median fails the gate
    node_check_s: float = 45.0  # after peer errors: how long to wait for Slurm to mark a node down
    restart: str = "resubmit"  # resubmit: a new job at once | requeue: scontrol requeue (site delay)


@dataclass
class TrainConfig:
    # The run's length: max_steps wins when set; else tokens / tokens per step (rounded down); else
    # DEFAULT_MAX_STEPS. The OPT recipes set tokens (300B), so train.max_steps=20 still shortens them.
    max_steps: Optional[int] = None
    tokens: Optional[float] = None
    micro_batch_size: int = 4
    # Sequences per optimizer step. None: global_batch_tokens / data.seq_len when that is set (the
    # OPT recipes give the batch in tokens), else micro batch x grad_accumulation x data-parallel
    # size of the largest allocation, fixed at the first submission; afterwards constant across
    # world sizes (grad accumulation adjusts).
    global_batch_size: Optional[int] = None
    global_batch_tokens: Optional[float] = None
    grad_accumulation: int = 1  # only used to derive global_batch_size when it is None
    log_interval: int = 10
    seed: int = 1234
    # DeepSpeed's wall_clock_breakdown timers: the forward/backward/optimizer/comm split of each
    # step, and what straggler detection needs (a rank's time minus its waits in collectives).
    timers: bool = True
    flops_profile_step: int = 0  # N > 0: DeepSpeed's FLOPs profiler on step N -> profile/ (0: off)
    # N > 0: peak tensor memory from model build to step N against the planner (ledger
    # memory_checked). GPUs: free (allocator stats); CPUs: PyTorch's profiler until step N.
    memory_check_step: int = 0
    straggler_factor: float = 1.5  # flag a rank slower than the median rank by more than this
    # N > 0: an attempt that starts before step N saves at N and exits (paused); the next job
    # resumes. The smoke test's real save -> new job -> load. 0: never.
    pause_at_step: int = 0


@dataclass
class RootConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    deepspeed: DeepSpeedConfig = MISSING
    checkpoint: CheckpointConfig = MISSING
    cluster: ClusterConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    name: str = "demo"
    runs_root: str = "runs"
    nodes: Any = 1  # an int, or a range "2-4" that Slurm may start at any size within
    # 0: CPU (gloo); > 0: one task per GPU (NCCL); "auto": the chosen partition's GPUs on Slurm,
    # `nvidia-smi -L` on this machine (login/placement.py resolves it before validation).
    gpus_per_node: Any = 0
    dry_run: bool = False
    new_run: bool = False  # start a fresh run even if this exact config already ran
    force: bool = False  # submit even when the memory plan says it does not fit
    mfu_guess: float = 0.4  # MFU assumed for an ETA before any throughput was measured
    peak_tflops: Optional[float] = None  # overrides the GPU table (MFU on CPUs or unlisted GPUs)
    # cluster=slurm: first a small job (1 node, <= 2 layers, 20 steps, a save and a load in a new
    # job), then this one with --dependency=afterok on it (slurmtrain/smoke.py).
    smoke: bool = False


# Keys that do not change what is computed: a run moved to another cluster, renamed, or resumed on
# another node count (the global batch is fixed) is the same experiment.
NON_RESULT_KEYS = ("name", "runs_root", "dry_run", "new_run", "force", "mfu_guess", "peak_tflops",
                   "nodes", "gpus_per_node", "cluster", "faults", "smoke",
                   "train.log_interval", "train.pause_at_step", "train.grad_accumulation",
                   "train.timers", "train.flops_profile_step", "train.memory_check_step",
                   "train.straggler_factor", "checkpoint")


def register() -> None:
    """The schema under conf/config.yaml's defaults: every group file is typed against it."""
    ConfigStore.instance().store(name="slurmtrain_schema", node=RootConfig)


CONF_PACKAGE = "slurmtrain.conf"  # the repository's conf/, mapped into the package (pyproject.toml)


def conf_dir() -> str:
    """The config directory on disk, found through the package mapping: wheel or editable install."""
    from importlib.resources import files

    return str(files(CONF_PACKAGE))


def node_range(nodes: Any) -> tuple[int, int]:
    """`nodes` as (min, max): 4 -> (4, 4); "2-4" -> (2, 4). Raises ConfigError otherwise."""
    text = str(nodes).strip()
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    if isinstance(nodes, bool) or not match:
        raise ConfigError(f"nodes={nodes!r}: not a node count; use a positive integer (nodes=4) "
                          f"or a range (nodes=2-4)")
    low, high = int(match[1]), int(match[2] or match[1])
    if low < 1 or high < low:
        raise ConfigError(f"nodes={nodes!r}: must be >= 1 (and min <= max in a range); e.g. nodes=1")
    return low, high


def tasks_per_node(cfg: DictConfig) -> int:
    return cfg.gpus_per_node if cfg.gpus_per_node > 0 else cfg.cluster.cpu_tasks_per_node


def world_size(cfg: DictConfig, nodes: Optional[int] = None) -> int:
    return (nodes or node_range(cfg.nodes)[1]) * tasks_per_node(cfg)


def grad_accumulation(cfg: DictConfig, world: int) -> int:
    """Global batch = micro batch x grad accumulation x data-parallel size; only accumulation moves."""
    per_step = cfg.train.micro_batch_size * world
    gbs = cfg.train.global_batch_size
    if gbs % per_step:
        raise ConfigError(
            f"train.global_batch_size={gbs}: not divisible by micro batch x world size "
            f"= {cfg.train.micro_batch_size} x {world} = {per_step}; use a multiple of {per_step} "
            f"(e.g. train.global_batch_size={per_step * max(1, gbs // per_step)})")
    return gbs // per_step


def resolved_dtype(cfg: DictConfig) -> str:
    if cfg.deepspeed.dtype == "auto":
        return "bf16" if cfg.gpus_per_node > 0 else "fp32"
    return cfg.deepspeed.dtype


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}={value!r}: must be a positive integer; e.g. {key}=1")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: unknown; choose one of {', '.join(choices)}")


DEFAULT_MAX_STEPS = 200  # the tiny demo's length when neither max_steps nor tokens is given
DEFAULT_WARMUP_STEPS = 10


def _per_tokens(key: str, tokens: Any, per: int) -> int:
    """A token budget as whole `per`-token steps, rounded down as metaseq does (at least 1)."""
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens <= 0:
        raise ConfigError(f"{key}={tokens!r}: must be a positive number of tokens; e.g. {key}=3e11")
    return max(1, int(tokens) // per)


def resolve_batch(cfg: DictConfig) -> None:
    """Fill in what was left to be derived (login node, before hashing): the global batch (from
    tokens or from micro x accumulation x world), the run length and warm-up (steps from tokens),
    and the decay floor (a fraction of the peak lr)."""
    t, o = cfg.train, cfg.optim
    if t.global_batch_size is None and t.global_batch_tokens is not None:
        _positive("data.seq_len", cfg.data.seq_len)
        tokens = t.global_batch_tokens
        if (isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens <= 0
                or int(tokens) != tokens or int(tokens) % cfg.data.seq_len):
            raise ConfigError(f"train.global_batch_tokens={tokens:g}: must be a whole number of "
                              f"sequences of data.seq_len={cfg.data.seq_len} tokens; e.g. "
                              f"train.global_batch_tokens={cfg.data.seq_len * 256}")
        t.global_batch_size = int(tokens) // cfg.data.seq_len
    if t.global_batch_size is None:
        _positive("train.micro_batch_size", t.micro_batch_size)
        _positive("train.grad_accumulation", t.grad_accumulation)
        t.global_batch_size = t.micro_batch_size * t.grad_accumulation * world_size(cfg)
    _positive("train.global_batch_size", t.global_batch_size)
    step_tokens = t.global_batch_size * cfg.data.seq_len
    if t.max_steps is None:
        t.max_steps = (_per_tokens("train.tokens", t.tokens, step_tokens)
                       if t.tokens is not None else DEFAULT_MAX_STEPS)
    if o.warmup_steps is None:
        o.warmup_steps = (_per_tokens("optim.warmup_tokens", o.warmup_tokens, step_tokens)
                          if o.warmup_tokens is not None else DEFAULT_WARMUP_STEPS)
    if o.warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps={o.warmup_steps}: must be >= 0; e.g. "
                          f"optim.warmup_steps=10")
    if o.min_lr is None:
        if not 0 < o.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio}: must be in (0, 1] (the "
                              f"decay floor as a fraction of optim.lr); e.g. optim.min_lr_ratio=0.1")
        o.min_lr = o.lr * o.min_lr_ratio
    if not 0 < o.min_lr <= o.lr:
        raise ConfigError(f"optim.min_lr={o.min_lr}: must be > 0 and <= optim.lr={o.lr} "
                          f"(0 makes the first warm-up updates no-ops); e.g. optim.min_lr={o.lr / 10:g}")


def validate(cfg: DictConfig, submitting: bool = True) -> None:
    """Every check Hydra's types cannot do; the first failure raises one ConfigError line.

    A dry run plans any size (`model=opt13b nodes=64` on a laptop); only a real submission needs a
    backend that can place it.
    """
    low, high = node_range(cfg.nodes)
    if cfg.gpus_per_node == "auto" or cfg.cluster.kind == "auto":
        raise ConfigError("cluster.kind/gpus_per_node=auto: not resolved; the launch flow calls "
                          "slurmtrain.login.placement.resolve_auto first (or set them explicitly)")
    if (isinstance(cfg.gpus_per_node, bool) or not isinstance(cfg.gpus_per_node, int)
            or cfg.gpus_per_node < 0):
        raise ConfigError(f"gpus_per_node={cfg.gpus_per_node!r}: must be auto or an integer >= 0 "
                          f"(0 means CPU); e.g. gpus_per_node=8")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", str(cfg.name)):
        raise ConfigError(f"name={cfg.name!r}: a run name is a directory and a job name; use "
                          f"letters, digits and ._- (e.g. name=opt13b-lr3e-4)")
    resolve_batch(cfg)
    for key in ("train.max_steps", "train.micro_batch_size", "train.global_batch_size",
                "train.log_interval", "data.seq_len", "model.num_layers", "model.hidden_size",
                "model.num_heads", "cluster.cpu_tasks_per_node", "checkpoint.keep_last"):
        _positive(key, OmegaConf.select(cfg, key))
    for key, example in (("train.flops_profile_step", 10), ("train.memory_check_step", 3)):
        value = OmegaConf.select(cfg, key)
        if not 0 <= value <= cfg.train.max_steps:
            raise ConfigError(f"{key}={value}: must be 0 (off) or a step up to train.max_steps="
                              f"{cfg.train.max_steps}; e.g. {key}={example}")
    if cfg.train.straggler_factor <= 1:
        raise ConfigError(f"train.straggler_factor={cfg.train.straggler_factor}: must be > 1 "
                          f"(times the median rank's step time); e.g. train.straggler_factor=1.5")
    if cfg.train.pause_at_step < 0:
        raise ConfigError(f"train.pause_at_step={cfg.train.pause_at_step}: must be 0 (never) or a "
                          f"step; e.g. train.pause_at_step=10")
    if submitting and cfg.smoke and cfg.cluster.kind != "slurm":
        raise ConfigError(f"smoke=true: chains a smoke job before the real one on Slurm; use "
                          f"cluster=slurm (cluster.kind is {cfg.cluster.kind!r}) or smoke=false")
    _choice("cluster.kind", cfg.cluster.kind, ("local", "slurm"))
    _choice("cluster.container", cfg.cluster.container, ("none", "apptainer", "pyxis"))
    _choice("data.kind", cfg.data.kind, ("synthetic", "tokens"))
    _choice("deepspeed.dtype", cfg.deepspeed.dtype, ("auto", "bf16", "fp16", "fp32"))
    _choice("checkpoint.verify", cfg.checkpoint.verify, ("checksum", "size"))
    _choice("faults.restart", cfg.faults.restart, ("resubmit", "requeue"))
    _choice("checkpoint.on_save_error", cfg.checkpoint.on_save_error, ("continue", "stop"))
    if cfg.deepspeed.stage not in (0, 1, 2, 3):
        raise ConfigError(f"deepspeed.stage={cfg.deepspeed.stage}: ZeRO stages are 0-3; "
                          f"e.g. deepspeed=zero2")
    if cfg.deepspeed.offload_param and cfg.deepspeed.stage != 3:
        raise ConfigError(f"deepspeed.offload_param=true: needs ZeRO-3 (stage is "
                          f"{cfg.deepspeed.stage}); use deepspeed=zero3_offload")
    for key in DERIVED_DEEPSPEED_KEYS:
        if key in cfg.deepspeed.extra:
            raise ConfigError(f"deepspeed.extra.{key}: derived from train.micro_batch_size and "
                              f"train.global_batch_size; set those instead")
    if cfg.model.hidden_size % cfg.model.num_heads:
        raise ConfigError(f"model.num_heads={cfg.model.num_heads}: must divide model.hidden_size="
                          f"{cfg.model.hidden_size}")
    if cfg.data.kind == "tokens":
        path = cfg.data.path
        if not path or not os.path.isfile(path):
            raise ConfigError(f"data.path={path!r}: no such token file; make one with "
                              f"`python tools/prepare_data.py --out FILE.bin TEXT_FILES` and pass "
                              f"data.path=FILE.bin")
        meta_path = os.path.splitext(path)[0] + ".json"
        vocab = _sidecar_vocab(meta_path)
        if vocab is not None and vocab > cfg.model.vocab_size:
            raise ConfigError(f"data.path={path!r}: tokens go up to {vocab} but model.vocab_size="
                              f"{cfg.model.vocab_size}; use a model with a larger vocabulary or "
                              f"set model.vocab_size={vocab}")
    if cfg.data.seq_len > cfg.model.max_positions:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len}: above model.max_positions="
                          f"{cfg.model.max_positions}; use data.seq_len<={cfg.model.max_positions}")
    if submitting and cfg.cluster.kind == "local" and high != 1:
        raise ConfigError(f"nodes={cfg.nodes!r}: the local executor runs on this machine only; "
                          f"use nodes=1 or cluster=slurm")
    for n in sorted({low, high}):
        grad_accumulation(cfg, world_size(cfg, n))
    if cfg.model.pretrained_path and not os.path.isdir(cfg.model.pretrained_path):
        raise ConfigError(f"model.pretrained_path={cfg.model.pretrained_path!r}: not a directory; "
                          f"point it at a local Hugging Face model folder")


def _sidecar_vocab(meta_path: str) -> Optional[int]:
    try:
        with open(meta_path) as f:
            return int(json.load(f)["vocab_size"])
    except (OSError, ValueError, KeyError):
        return None


def load_run_config(path: str) -> DictConfig:
    """A run directory's config.yaml, typed against the schema again (compute node)."""
    cfg = OmegaConf.merge(OmegaConf.structured(RootConfig), OmegaConf.load(path))
    OmegaConf.set_readonly(cfg, True)
    return cfg
