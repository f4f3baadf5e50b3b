"""The one typed config schema the login and compute sides share.

Dataclasses registered with Hydra's ConfigStore, so Hydra type-checks every override and an Enum
field refuses a value outside its choices at compose time; the checks types cannot express live in
common/validation.py. Nothing here imports torch: the login node composes in well under a second.

Enum members are named as users type them (`data.kind=tokens`), and each is a `str` equal to its
name, so `cfg.data.kind == "tokens"` holds, config.yaml stores the name and fingerprints hash it.
Fields typed `Any` hold an int or a string (OmegaConf 2.3 has no Union), or are dicts passed through
to a library (OmegaConf refuses `object` as a value type).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from slurmtrain.common.schema_cluster import ClusterConfig, ClusterKind, Container, StrEnum
from slurmtrain.common.schema_logger import LoggerConfig, WandbMode
from slurmtrain.common.schema_restart import RestartKeys

__all__ = ["ClusterConfig", "ClusterKind", "Container", "LoggerConfig", "WandbMode"]


class DataKind(StrEnum):
    synthetic = "synthetic"  # stdlib text as bytes, on every machine
    tokens = "tokens"  # one .bin file (data.path)
    blend = "blend"  # weighted .bin files (data.sources)
    text = "text"  # jsonl/parquet/text/`datasets` folder (data.path), tokenized at submit


class OptimName(StrEnum):
    adamw = "adamw"


class LrDecay(StrEnum):
    linear = "linear"  # metaseq
    cosine = "cosine"  # Llama


class Dtype(StrEnum):
    auto = "auto"  # bf16 on GPUs, fp32 on CPUs
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class VerifyMode(StrEnum):
    checksum = "checksum"  # CRC-32 of every file (checkpoint.CHECKSUM)
    size = "size"  # sizes only


# `continue` is a keyword, so the functional form: members still named as users type them.
OnSaveError = StrEnum("OnSaveError", [("continue", "continue"), ("stop", "stop")])


class RestartMode(StrEnum):
    resubmit = "resubmit"  # a new job at once
    requeue = "requeue"  # scontrol requeue (the site's requeue delay applies)


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
    # Weights ~ N(0, init_std); scaled_init: residual-branch outputs get init_std / sqrt(2 x layers)
    # (metaseq's --full-megatron-init), so the residual stream's variance does not grow with depth.
    init_std: float = 0.02
    scaled_init: bool = False
    activation_checkpointing: bool = False
    pretrained_path: Optional[str] = None  # a local Hugging Face directory; nothing is downloaded
    # Filled in at login: the fingerprint changes when the weights do.
    pretrained_checksum: Optional[str] = None
    # The transformers model_type (any causal LM: a free string); GQA when num_kv_heads < num_heads.
    family: str = "opt"
    num_kv_heads: Optional[int] = None
    tie_embeddings: bool = True  # lm_head shares the token embedding (OPT always does)
    hf_extra: dict[str, Any] = field(default_factory=dict)  # passed through to transformers
    config: Optional[str] = None  # model=hf: a local config.json or its folder, read at login
    # auto: SDPA where the family's class supports it, else eager; sdpa, eager, flash_attention_2
    attn_implementation: str = "auto"


@dataclass
class DataSource:
    path: str = MISSING  # a .bin written by `slurmtrain prepare-data`
    weight: float = 1.0  # share of the samples (weights are normalised)


@dataclass
class DataConfig:
    kind: DataKind = DataKind.synthetic
    path: Optional[str] = None  # tokens: the .bin written by `slurmtrain prepare-data`
    sources: list[DataSource] = field(default_factory=list)  # blend: [{path: a.bin, weight: 0.7}]
    seq_len: int = 128
    max_corpus_bytes: int = 4_000_000  # synthetic: how much stdlib source to gather
    seed: int = 1234  # shuffling order of the samples
    # Held-out data, never trained on: the last valid_fraction of each source's tokens (0: none;
    # the data group files set 0.01), or a separate token file valid_path (the corpus trains whole).
    valid_fraction: float = 0.0
    valid_path: Optional[str] = None
    valid_windows: int = 64  # the fixed validation windows, evenly spaced over the held-out tokens
    # A branch (resume_from) skips this many samples past the parent's position: the "skip the data
    # that diverged" intervention.
    skip_samples: int = 0
    # data=text (common/text_corpus.py): data.path's records are tokenized once, at submit, into a
    # cache keyed by their content; the compute side reads that .bin as data=tokens reads its own.
    text_field: str = "text"  # the column (jsonl key) holding each document
    tokenizer: Optional[str] = None  # None: model.config's folder's tokenizer, else bytes
    num_proc: int = 0  # tokenizing processes; 0: by corpus size (one per core for big corpora)
    cache_dir: Optional[str] = None  # None: RUNS_ROOT/.tokenized (compute nodes read runs_root)
    # Set at login, not by hand: the corpus's identity (input bytes, tokenizer, text_field) and
    # the cached token file the compute side reads.
    text_checksum: Optional[str] = None
    tokens_path: Optional[str] = None


@dataclass
class OptimConfig:
    name: OptimName = OptimName.adamw
    lr: float = 1e-3  # peak
    # Linear warm-up from 0 to `lr` (update n at lr x n / warmup), then linear decay to min_lr at the
    # last step (metaseq's; ds_config.lr_at). None: min_lr_ratio x lr (OPT: 10% of peak).
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
    decay: LrDecay = LrDecay.linear  # after warm-up, to min_lr


@dataclass
class DeepSpeedConfig:
    stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False
    dtype: Dtype = Dtype.auto
    extra: dict[str, Any] = field(default_factory=dict)  # passed through to the DeepSpeed config


@dataclass
class CheckpointConfig:
    # auto: planned (planning/policy.py): Young/Daly's interval on GPUs, 25 steps on CPUs. 0: never.
    interval_steps: Any = "auto"
    interval_minutes: float = 0.0  # 0: never by time; both set: whichever comes first
    keep_last: int = 3
    # Also keep forever the first checkpoint past every Nth step (0: none): a rollback needs one from
    # before an instability began, which builds up over hundreds of steps, beyond keep_last's reach.
    keep_every: int = 1000
    verify: VerifyMode = VerifyMode.checksum
    # The loop waits only for the copy to host memory (2x host memory); files are written behind it.
    async_save: Any = "auto"  # auto: on GPUs (true), off on CPUs (false)
    # A failed save (disk full...): continue (retry at the next) or stop.
    on_save_error: OnSaveError = OnSaveError["continue"]
    publish_timeout_minutes: float = 30.0  # async: rank 0 gives up on a rank's files after this
    final_save: bool = True  # false: no save at max_steps (benchmarks; the run is not resumable)
    # Where checkpoints live (scratch, flash), absolute; None: in the run directory. The run
    # directory keeps config, ledger and logs, and `checkpoints` links there (common/checkpoint_dir.py).
    dir: Optional[str] = None
    local_every_steps: Any = "auto"  # local tier + buddy copy every K; 0: off; local_tier_plan.py
    local_dir: Optional[str] = None  # absolute, `{node}` allowed; None: $SLURM_TMPDIR or /dev/shm


@dataclass
class FaultsConfig(RestartKeys):  # and StragglerKeys, through it
    # Failure budgets across all attempts (-1: unlimited); past one the run stops instead of requeueing.
    max_preempted: int = -1
    max_timed_out: int = 1000
    max_node_failure: int = 20
    max_hang: int = 5
    max_crash: int = 3
    max_config_error: int = 0
    max_oom: int = 3  # out of memory (GPU or host): the node and step are named in the ledger
    crash_loop: int = 2  # this many crashes in a row at the same step: stop, it will not heal
    hang_timeout_s: float = 600.0  # no step progress for this long: dump stacks, exit, requeue
    # Every other phase has its own deadline (planning/deadlines.py); a heartbeat restarts it.
    startup_timeout_s: float = 1800.0  # rendezvous, health gate, model build (plus its bytes)
    io_floor_s: float = 300.0  # checkpoint verify/convert/load/save: at least this, plus ...
    io_safety: float = 3.0  # ... this many times the phase's bytes over the rates below
    # The checkpoint filesystem's rates per node, until the run has measured its own.
    io_write_mb_per_s: float = 1000.0
    io_read_mb_per_s: float = 2000.0
    # One node's mean time between failures, for the checkpoint interval (the job's: this / nodes);
    # Llama 3's fleet (Dubey et al. 2024, sec. 3.3.4): 419 interruptions, 54 days, 2,048 nodes.
    node_mtbf_h: float = 6334.0
    collective_timeout_s: float = 1800.0  # NCCL/gloo; >= hang_timeout_s + max(120 s, 10 %)
    health_check: bool = True  # devices, a checked matmul and a timed all-reduce before loading
    health_slow_factor: float = 5.0  # a node this much slower than the median fails the gate
    # After peer errors, how long Slurm may take to mark a node down. 0: SlurmdTimeout + 30 s.
    node_check_s: float = 0.0
    # A node excluded for a failure is tried again after this many hours (-1: never).
    exclude_hours: float = 24.0
    # Hot spares (Slurm, --no-kill): after a failure the next attempt starts inside the allocation,
    # a spare replacing the failed node, without a trip through the queue.
    spare_nodes: int = 0
    restart: RestartMode = RestartMode.resubmit
    # Divergence (non-finite loss or grad norm, a loss spike): roll back in-process to the newest
    # valid checkpoint and skip the data window that diverged (PaLM's practice).
    max_diverged: int = 0  # attempts ended `diverged` before the run stops (0: the first)
    max_checkpoint_unreadable: int = 0  # attempts that found every published checkpoint bad
    # In-process rollbacks over the whole run; one more stops it `diverged` (-1: no cap).
    max_rollback: int = 5
    # A divergence within this many steps of the previous rollback's is the same instability come
    # back: the rollback returns to a checkpoint older than the previous one's (0: never deeper).
    rollback_repeat_window: int = 500
    # Steps' worth of samples skipped after a rollback (at most max_steps / 10, at least the window).
    skip_batches: int = 200
    spike_factor: float = 0.0  # > 1: a loss above factor x the running median rolls back (0: off)
    spike_window: int = 50  # steps in that running median (it needs 10 before it judges)
    # fp16: more overflow-skipped steps in a row than this is a divergence (-1: no cap); 50 is far
    # past a healthy calibration (2^16 -> 1 is 17 halvings).
    max_overflow_steps: int = 50
    # Fault injection (SLURMTRAIN_INJECT) is for drills: honoured only when the command opts in.
    allow_inject: bool = False


@dataclass
class TrainConfig:
    # The run's length: max_steps wins; else tokens / tokens per step; else DEFAULT_MAX_STEPS.
    max_steps: Optional[int] = None
    tokens: Optional[float] = None
    micro_batch_size: int = 4
    # Sequences per optimizer step. None: global_batch_tokens / seq_len, else micro batch x
    # grad_accumulation x the largest world size; fixed at submission (accumulation adjusts).
    global_batch_size: Optional[int] = None
    global_batch_tokens: Optional[float] = None
    grad_accumulation: int = 1  # only used to derive global_batch_size when it is None
    log_interval: int = 10
    # Validation loss on the held-out windows every N steps and at the last step (0: off).
    eval_interval: int = 50
    seed: int = 1234
    # DeepSpeed's wall_clock_breakdown timers (the step's split, straggler detection); off by default:
    # they synchronize the device several times per micro step.
    timers: bool = False
    flops_profile_step: int = 0  # N > 0: DeepSpeed's FLOPs profiler on step N -> profile/ (0: off)
    # N > 0: peak tensor memory until step N against the planner's (ledger memory_checked).
    memory_check_step: int = 0
    straggler_factor: float = 1.5  # unread: faults.straggler_threshold; other values refused
    # N > 0: an attempt starting before step N saves at N and exits; the next job resumes (smoke).
    pause_at_step: int = 0


@dataclass
class ParallelConfig:
    # Tensor parallelism (DeepSpeed AutoTP) within a node; data-parallel size = world / (tensor x
    # sequence).
    tensor: int = 1
    # Sequence parallelism (DeepSpeed Ulysses): each sequence split over this many ranks.
    sequence: int = 1


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
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # trackers: metrics, events
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    name: str = "demo"
    runs_root: str = "runs"
    nodes: Any = 1  # an int, or a range "2-4" that Slurm may start at any size within
    # 0: CPU (gloo); > 0: one task per GPU (NCCL); "auto": the chosen partition's GPUs on Slurm,
    # `nvidia-smi -L` on this machine (login/placement.py resolves it before validation).
    gpus_per_node: Any = 0
    dry_run: bool = False
    new_run: bool = False  # start a fresh run even if this exact config already ran
    force: bool = False  # submit even when the memory plan says it does not fit
    # MFU an ETA assumes before the run measured its throughput: a fraction set by hand, or auto:
    # mfu_measured's (a bench/gpu_check.py JSON-lines file), else a table (planning/mfu.py).
    mfu_guess: Any = "auto"
    mfu_measured: Optional[str] = None
    peak_tflops: Optional[float] = None  # overrides the GPU table (MFU on CPUs or unlisted GPUs)
    # Slurm: a small job first (save, then load in a new job); this one depends on it (login/smoke.py).
    smoke: bool = False
    # Which checkpoint the next attempt loads: auto (the newest valid one), none (step 0; old ones
    # move aside) or step_N (newer ones move aside). none/step_N apply once, after submission.
    resume: str = "auto"
    # Mode of each run directory (octal; owner rwx, nothing for others, whatever the umask);
    # 0750 lets the group read, 0770 write (common/ownership.py).
    run_dir_mode: str = "0700"
    # Branch a run: RUN_DIR (or name / fingerprint)[:step_N]: a new run from that checkpoint with
    # this command's overrides (login/branch.py); its identity is branch_of.
    resume_from: Optional[str] = None
    branch_of: Optional[str] = None  # "<parent fingerprint>:step_N" (fingerprinted: the lineage)


# Keys that do not change what is computed: a run moved to another cluster, renamed, or resumed on
# another node count (the global batch is fixed) is the same experiment.
NON_RESULT_KEYS = (
    "name",
    "runs_root",
    "dry_run",
    "new_run",
    "force",
    "mfu_guess",
    "mfu_measured",
    "peak_tflops",
    "nodes",
    "gpus_per_node",
    "cluster",
    "faults",
    "smoke",
    "resume",
    "run_dir_mode",
    "resume_from",  # the parent's path; its identity and step are in branch_of
    "model.config",  # a path; its contents are read into model.family/shape keys/hf_extra
    # data=text: what the tokens are is data.text_checksum (a result key); these say where from/to
    "data.text_field",
    "data.tokenizer",
    "data.num_proc",
    "data.cache_dir",
    "data.tokens_path",
    "train.log_interval",
    "train.eval_interval",
    "train.pause_at_step",
    "train.grad_accumulation",
    "train.timers",
    "train.flops_profile_step",
    "train.memory_check_step",
    "train.straggler_factor",
    "checkpoint",
    "logger",  # where metrics are mirrored: changing trackers keeps the run (and its W&B id)
)


def register() -> None:
    """The schema under conf/config.yaml's defaults: every group file is typed against it."""
    from hydra.core.config_store import ConfigStore  # composing only: workers load without Hydra

    ConfigStore.instance().store(name="slurmtrain_schema", node=RootConfig)


CONF_PACKAGE = "slurmtrain.conf"  # the repository's conf/, mapped into the package (pyproject.toml)


def conf_dir() -> str:
    """The config directory on disk, found through the package mapping: wheel or editable install."""
    return str(files(CONF_PACKAGE))


_ENV_REFERENCE = re.compile(r"\$\{oc\.env:([^,}]+)\}")  # as secrets.reference writes it


def _unset_references_kept(node: object) -> object:
    """config.yaml's secret references (common/secrets.py) whose variable is not set here, escaped
    so they stay as written: the typed config resolves every value at load, and a reader without
    the job's secrets.env (export, sample) must not fail on a secret it never reads."""
    if isinstance(node, dict):
        return {key: _unset_references_kept(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_unset_references_kept(value) for value in node]
    if isinstance(node, str):
        found = _ENV_REFERENCE.fullmatch(node)
        if found and found[1] not in os.environ:
            return "\\" + node
    return node


def load_run_config(path: str) -> RootConfig:
    """A run directory's config.yaml, typed against the schema again (compute node)."""
    written = _unset_references_kept(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
    assert isinstance(written, dict), f"{path}: not a config"
    cluster = written.get("cluster")
    env = cluster.get("env") if isinstance(cluster, dict) else None
    if isinstance(env, dict):  # `\${VAR}` is the shell's (secrets.kept_literal): kept escaped,
        for key, value in env.items():  # so a plain() of the typed config keeps it too
            if isinstance(value, str):
                env[key] = value.replace("\\${", "\\\\\\${")
    kept = OmegaConf.create(written)
    merged = OmegaConf.merge(OmegaConf.structured(RootConfig), kept)
    config = OmegaConf.to_object(merged)
    assert isinstance(config, RootConfig)
    if config.model.config and not os.path.isabs(config.model.config):
        # model=hf: the run directory's copy of config.json (common/rundir.py records it relative)
        config.model.config = os.path.join(
            os.path.dirname(os.path.abspath(path)), config.model.config
        )
    return config


def plain(cfg: RootConfig | DictConfig, resolve: bool = True) -> dict[str, object]:
    """The config as plain dicts, lists and scalars, Enums as their names: what config.yaml stores
    and the fingerprint hashes. A DictConfig (login side) and a RootConfig (compute side) alike."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    data = OmegaConf.to_container(node, resolve=resolve, enum_to_str=True)
    assert isinstance(data, dict)
    return {str(key): value for key, value in data.items()}
