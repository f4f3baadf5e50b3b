"""What the login node shows before submitting: world size, batch math, memory fit, ETA.

Glue between the config and the pure planners (plan.py, flops.py, eta.py). `enforce` refuses a plan
that does not fit the GPUs (exit 2, one line with the numbers and the setting that would fit) unless
`force=true`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import DictConfig

from slurmtrain.common import ds_config
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import grad_accumulation, node_range, resolved_dtype, tasks_per_node
from slurmtrain.planning import ckpt_interval, eta, flops
from slurmtrain.planning import memory as plan


@dataclass
class PlanReport:
    lines: list[str] = field(default_factory=list)
    misfit: Optional[str] = None  # the refusal line when the plan does not fit

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def enforce(self, cfg: DictConfig) -> None:
        if self.misfit and not cfg.force:
            raise ConfigError(f"{self.misfit} (force=true submits anyway)")


def _setting(cfg: DictConfig) -> plan.Setting:
    ds = cfg.deepspeed
    return plan.Setting(
        ds.stage,
        ds.offload_optimizer,
        ds.offload_param,
        cfg.train.micro_batch_size,
        cfg.model.activation_checkpointing,
    )


def _buckets(cfg: DictConfig) -> dict:
    """The ZeRO buckets DeepSpeed will allocate for this run (ds_config is what it trains with)."""
    zero = ds_config.zero_section(cfg)
    return {
        "reduce_bucket": int(zero.get("reduce_bucket_size", plan.REDUCE_BUCKET)),
        "overlap_comm": bool(zero.get("overlap_comm", cfg.deepspeed.stage == 3)),
    }


def memory_plan(cfg: DictConfig, nodes: int) -> plan.MemoryPlan:
    """Memory per rank of this run on `nodes` nodes: per GPU, or per CPU rank on CPUs."""
    return plan.plan_memory(
        cfg.model,
        nodes=nodes,
        gpus_per_node=tasks_per_node(cfg),
        seq_len=cfg.data.seq_len,
        dtype=resolved_dtype(cfg),
        device="cuda" if cfg.gpus_per_node > 0 else "cpu",
        **_buckets(cfg),
        **_setting(cfg).knobs(),
    )


def memory_lines(cfg: DictConfig, nodes: int, out: PlanReport) -> None:
    gpus, dtype = cfg.gpus_per_node, resolved_dtype(cfg)
    seq, gpu_mem = cfg.data.seq_len, int(cfg.cluster.gpu_mem_gb * plan.GiB)
    cpu_mem = int(cfg.cluster.cpu_mem_gb * plan.GiB) if cfg.cluster.cpu_mem_gb else None
    mine = memory_plan(cfg, nodes)
    g = plan.GiB
    out.lines.append(
        f"plan: memory/GPU {mine.total / g:.1f} GiB of {cfg.cluster.gpu_mem_gb:g} GiB = params "
        f"{mine.params / g:.1f} + grads {mine.grads / g:.1f} + optimizer {mine.optimizer / g:.1f} "
        f"+ activations {mine.activations / g:.1f} + buffers {(mine.buffers + mine.overhead) / g:.1f}"
        f"; host/node {mine.cpu_per_node / g:.0f} GiB"
    )
    if mine.fits(gpu_mem, cpu_mem):
        out.lines.append(f"plan: fits ({mine.total / g:.1f} <= {cfg.cluster.gpu_mem_gb:g} GiB/GPU)")
        return
    best = plan.recommend(
        cfg.model,
        nodes=nodes,
        gpus_per_node=gpus,
        gpu_mem_bytes=gpu_mem,
        seq_len=seq,
        dtype=dtype,
        cpu_mem_bytes_per_node=cpu_mem,
        global_batch_size=cfg.train.global_batch_size,
        **_buckets(cfg),
    )
    out.misfit = f"plan does not fit: {plan.summary(mine, gpu_mem, best)}"
    out.lines.append(out.misfit)


def eta_line(cfg: DictConfig, world: int, measured_tps: Optional[float]) -> Optional[str]:
    fpt = flops.flops_per_token(cfg.model, cfg.data.seq_len)
    tps, source = measured_tps, "measured"
    if tps is None:
        peak = cfg.peak_tflops or flops.detect_peak(cfg.cluster.gpu_type, resolved_dtype(cfg))
        if cfg.gpus_per_node == 0 and not cfg.peak_tflops:
            return None  # no honest guess for CPUs
        if not peak:
            return None
        tps, source = world * peak * 1e12 * cfg.mfu_guess / fpt, f"{cfg.mfu_guess:.0%} MFU guess"
    est = eta.estimate_eta(
        current_step=0,
        max_steps=cfg.train.max_steps,
        tokens_per_step=cfg.train.global_batch_size * cfg.data.seq_len,
        tokens_per_s=tps,
        time_limit_s=eta.slurm_time_seconds(cfg.cluster.time)
        if cfg.cluster.kind == "slurm"
        else None,
        signal_lead_s=cfg.cluster.signal_lead_s,
        save_every_steps=cfg.checkpoint.interval_steps,
    )
    return f"plan: {eta.format_eta(est)} (at {tps:,.0f} tok/s, {source})"


# Before the first save: bytes of a checkpoint (weights + fp32 master + Adam moments, all ranks)
# over an assumed shared-filesystem write rate, plus fixed costs (fsync, manifest, rename).
ASSUMED_WRITE_BYTES_PER_S = 1e9
SAVE_FIXED_S = 5.0


def save_seconds(cfg: DictConfig, saves: list[dict]) -> tuple[float, str]:
    """The time a full save takes for this run: measured (ledger) or estimated from its size."""
    measured = ckpt_interval.measured_save_seconds(saves, worst=True, key="total_seconds")
    if measured is not None:
        return measured, "measured"
    n = plan.param_count(cfg.model)
    weight = 4 if resolved_dtype(cfg) == "fp32" else 2
    return n * (weight + 12) / ASSUMED_WRITE_BYTES_PER_S + SAVE_FIXED_S, "estimated"


def lead_warning(cfg: DictConfig, saves: list[dict]) -> Optional[str]:
    """USR2 comes `signal_lead_s` before the time limit; the save must finish well inside it."""
    if cfg.cluster.kind != "slurm":
        return None
    seconds, how = save_seconds(cfg, saves)
    if cfg.cluster.signal_lead_s >= 2 * seconds:
        return None
    return (
        f"warning: cluster.signal_lead_s={cfg.cluster.signal_lead_s} is below twice the "
        f"{how} checkpoint save time ({seconds:.0f} s): the time-limit save may be cut short; "
        f"set cluster.signal_lead_s>={int(2 * seconds) + 1}"
    )


def report(cfg: DictConfig, measured_tps: Optional[float] = None) -> PlanReport:
    low, high = node_range(cfg.nodes)
    per_node = tasks_per_node(cfg)
    out = PlanReport()
    device = f"{cfg.gpus_per_node} GPUs" if cfg.gpus_per_node else "CPU"
    n = plan.param_count(cfg.model)
    size = f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
    out.lines.append(
        f"plan: {cfg.model.name} ({size} params), "
        f"ZeRO-{cfg.deepspeed.stage}, {resolved_dtype(cfg)}, nodes {cfg.nodes} x "
        f"{per_node} tasks ({device})"
    )
    for n in sorted({low, high}):
        world = n * per_node
        out.lines.append(
            f"plan: world size {world}: global batch {cfg.train.global_batch_size} = micro "
            f"{cfg.train.micro_batch_size} x grad accumulation {grad_accumulation(cfg, world)} x "
            f"data-parallel {world}"
        )
    if cfg.gpus_per_node > 0:
        memory_lines(cfg, low, out)  # the smallest allocation is the one that must fit
    else:
        mine = memory_plan(cfg, low)
        out.lines.append(f"plan: memory/rank {mine.total / 2**20:.1f} MiB of tensors (CPU ranks)")
    line = eta_line(cfg, low * per_node, measured_tps)
    if line:
        out.lines.append(line)
    return out
