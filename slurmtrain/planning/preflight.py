"""What the login node shows before submitting: world size, batch math, memory fit, ETA.

Glue between the config and the pure planners (memory.py, flops.py, eta.py, policy.py,
deadlines.py): on GPUs it also shows the checkpoint interval and its cost, the phase deadlines
in minutes and the time limit with its source. `enforce` refuses a plan
that does not fit the GPUs (exit 2, one line with the numbers and the setting that would fit) unless
`force=true`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Optional, Sequence, TypedDict

from slurmtrain.common import ds_config
from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import Row
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.validation_parallel import kv_warning
from slurmtrain.planning import (
    cards,
    deadlines,
    eta,
    flops,
    host_memory,
    local_tier_plan,
    memory,
    mfu,
    parallel_plan,
    policy,
    shapes,
)
from slurmtrain.planning.corpus_warning import corpus_warning

WIDTH = 120  # printed plans fit a terminal: longer lines wrap, indented


def fit(text: str, width: int = WIDTH) -> str:
    """Every line of `text` wrapped to `width` columns, continuations indented (a long path or
    word stays whole)."""
    out: list[str] = []
    for line in text.splitlines():
        out += textwrap.wrap(
            line, width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False
        ) or [""]
    return "\n".join(out)


@dataclass
class PlanReport:
    lines: list[str] = field(default_factory=list)
    misfit: Optional[str] = None  # the refusal line when the plan does not fit

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def shown(self) -> str:
        """The text as printed: each line wrapped to WIDTH columns (fit)."""
        return fit(self.text)

    def enforce(self, cfg: RootConfig) -> None:
        if self.misfit and not cfg.force:
            raise ConfigError(f"{self.misfit} (force=true submits anyway)")


def _setting(cfg: RootConfig) -> memory.Setting:
    ds = cfg.deepspeed
    return memory.Setting(
        ds.stage,
        ds.offload_optimizer,
        ds.offload_param,
        cfg.train.micro_batch_size,
        cfg.model.activation_checkpointing,
    )


class Buckets(TypedDict, total=False):
    """The ZeRO bucket keyword arguments of memory.plan_memory."""

    reduce_bucket: int
    overlap_comm: bool
    zero3: dict[str, object]


def _buckets(cfg: RootConfig) -> Buckets:
    """The ZeRO buckets DeepSpeed will allocate for this run (ds_config is what it trains with)."""
    zero = ds_config.zero_section(cfg)
    reduce = zero.get("reduce_bucket_size", memory.REDUCE_BUCKET)
    buckets: Buckets = {
        "reduce_bucket": int(reduce) if isinstance(reduce, (int, float, str)) else 0,
        "overlap_comm": bool(zero.get("overlap_comm", cfg.deepspeed.stage == 3)),
    }
    if cfg.deepspeed.stage == 3:  # its prefetch, live and persistence settings
        buckets["zero3"] = zero
    return buckets


class HostKnobs(TypedDict):
    """What decides a plan's host memory besides the ZeRO setting (planning/host_memory.py)."""

    pretrained: bool
    async_save: bool


def _host(cfg: RootConfig) -> HostKnobs:
    saving = cfg.checkpoint.async_save
    on_gpus = cfg.gpus_per_node > 0
    return {
        "pretrained": bool(cfg.model.pretrained_path),
        "async_save": on_gpus and (saving is True or saving == policy.AUTO),
    }


def memory_plan(cfg: RootConfig, nodes: int) -> memory.MemoryPlan:
    """Memory per rank of this run on `nodes` nodes: per GPU, or per CPU rank on CPUs."""
    return memory.plan_memory(
        cfg.model,
        nodes=nodes,
        gpus_per_node=derived_of(cfg).per_node,
        seq_len=cfg.data.seq_len // derived_of(cfg).sequence,  # SP: a rank's slice's activations
        dtype=derived_of(cfg).dtype,
        device="cuda" if cfg.gpus_per_node > 0 else "cpu",
        tensor_parallel=derived_of(cfg).tensor,
        **_buckets(cfg),
        **_host(cfg),
        **_setting(cfg).knobs(),
    )


def memory_lines(cfg: RootConfig, nodes: int, out: PlanReport) -> None:
    gpus, dtype = cfg.gpus_per_node, derived_of(cfg).dtype
    seq = cfg.data.seq_len // derived_of(cfg).sequence  # SP: a rank's slice
    gpu = cards.card(cfg)
    gpu_mem = gpu.mem_bytes
    cpu_mem = int(cfg.cluster.cpu_mem_gb * memory.GiB) if cfg.cluster.cpu_mem_gb else None
    mine = memory_plan(cfg, nodes)
    g = memory.GiB
    out.lines.append(
        f"plan: memory/GPU {mine.total / g:.1f} GiB of {gpu.mem_gib:.1f} GiB ({gpu.mem_source}) "
        f"= params {mine.params / g:.1f} + grads {mine.grads / g:.1f} + optimizer "
        f"{mine.optimizer / g:.1f} + activations {mine.activations / g:.1f} + buffers "
        f"{(mine.buffers + mine.overhead) / g:.1f}; host/node {mine.cpu_per_node / g:.0f} GiB "
        f"({mine.host.parts()})"
    )
    if mine.fits(gpu_mem, cpu_mem):
        out.lines.append(f"plan: fits ({mine.total / g:.1f} <= {gpu.mem_gib:.1f} GiB/GPU)")
        return
    best = memory.recommend(
        cfg.model,
        nodes=nodes,
        gpus_per_node=gpus,
        gpu_mem_bytes=gpu_mem,
        seq_len=seq,
        dtype=dtype,
        cpu_mem_bytes_per_node=cpu_mem,
        global_batch_size=cfg.train.global_batch_size,
        tensor_parallel=derived_of(cfg).tensor,
        **_buckets(cfg),
        **_host(cfg),
    )
    line = memory.summary(mine, gpu_mem, best, cpu_mem, gpu.mem_source)
    out.misfit = f"plan does not fit: {line}"
    out.lines.append(out.misfit)


def _min(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def deadline_line(cfg: RootConfig, nodes: int) -> str:
    """The phase deadlines an attempt on `nodes` nodes starts with (planning/deadlines.py)."""
    d = policy.attempt_deadlines(cfg, nodes)
    lay = policy.checkpoint_layout(cfg, nodes)
    parts = {
        "save": d.save_s(lay.save),
        "verify": d.read_s(lay.verify),
        "load": d.read_s(lay.load),
        "build": d.build_s(),
        "convert": d.convert_s(lay.convert.total),
        "step": d.fixed(deadlines.STEP),
    }
    return (
        "plan: deadlines (no heartbeat for): "
        + ", ".join(f"{name} {_min(s)}" for name, s in parts.items())
        + f" (faults.io_floor_s + {d.io_safety:g} x bytes / ({d.write_bps / 1e9:g} GB/s write, "
        f"{d.read_bps / 1e9:g} GB/s read per node x {d.nodes} nodes))"
    )


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes < 1e10 else f"{nbytes / 1e9:.0f} GB"


def checkpoint_line(cfg: RootConfig, nodes: int, plan: policy.CheckpointPlan) -> str:
    """The interval (Young/Daly's, or the one set by hand beside it) and what it costs."""
    c, lay = cfg.checkpoint, plan.layout
    world = nodes * derived_of(cfg).per_node
    others = (lay.save.total - lay.save.rank) / max(1, world - 1)
    young, chosen = round(plan.interval_s / 60), plan.chosen_s(cfg)
    hand = [f"checkpoint.interval_steps={c.interval_steps}"] if c.interval_steps else []
    if c.interval_minutes and (hand or c.interval_minutes != young):  # not policy.py's own
        hand.append(f"checkpoint.interval_minutes={c.interval_minutes:g}")
    when = f"every {chosen / 60:.0f} min" if chosen else "no periodic saves"
    head = f"{when} ({', '.join(hand + [f'Young/Daly {young} min'])})"
    line = (
        f"plan: checkpoints {head}: sqrt(2 x {plan.save_how} save {plan.save_s:.0f} s x job "
        f"MTBF {plan.mtbf_s / 3600:.1f} h = faults.node_mtbf_h={cfg.faults.node_mtbf_h:g} / "
        f"{nodes} nodes); "
        + (
            f"async (the loop waits ~{plan.blocking_s:.0f} s a save)"
            if c.async_save
            else f"sync (the loop waits {plan.blocking_s:.0f} s a save)"
        )
        + f"; a save {_gb(lay.save.total)} in all: {_gb(lay.save.rank)} on its busiest rank"
        + (f", {_gb(others)} on each other" if others < lay.save.rank * 0.99 else " and on each")
    )
    if chosen:
        o = plan.cost(chosen)
        line += (
            f"; cost {100 * (1 - o.goodput):.1f}% of wall time = saves {100 * o.saving:.1f}% + "
            f"lost work {100 * o.lost:.1f}% + restarts {100 * o.restarting:.1f}% "
            f"({plan.restart_s / 60:.1f} min each, queue waits aside)"
        )
    return line


def time_line(cfg: RootConfig) -> str:
    return (
        f"plan: time limit cluster.time={cfg.cluster.time} per attempt "
        f"({cfg.cluster.time_from or 'set by hand'})"
    )


def eta_line(
    cfg: RootConfig, world: int, measured_tps: Optional[float], plan: policy.CheckpointPlan
) -> Optional[str]:
    tps, source = measured_tps, "measured"
    if tps is None:
        tps, source = policy.planned_tokens_per_s(cfg, world)
        if tps is None:
            return None  # no honest guess for CPUs
    c, steps, batch = cfg.checkpoint, cfg.train.max_steps, cfg.train.global_batch_size
    assert steps is not None and batch is not None  # validation.resolve_batch filled them in
    est = eta.estimate_eta(
        current_step=0,
        max_steps=steps,
        tokens_per_step=batch * cfg.data.seq_len,
        tokens_per_s=tps,
        time_limit_s=eta.slurm_time_seconds(cfg.cluster.time)
        if cfg.cluster.kind == "slurm"
        else None,
        restart_overhead_s=plan.restart_s,
        save_s=plan.blocking_s,
        signal_save_s=plan.save_s,  # the time-limit save is synchronous
        signal_lead_s=cfg.cluster.signal_lead_s,
        save_every_steps=int(c.interval_steps),
        save_every_s=float(c.interval_minutes) * 60,
    )
    return f"plan: {eta.format_eta(est)} (at {tps:,.0f} tok/s, {source})"


def save_seconds(cfg: RootConfig, saves: Sequence[Row]) -> tuple[float, str]:
    """The time a full (synchronous) save takes for this run: measured (ledger) or planned from
    the bytes it moves over the aggregate write rate (planning/policy.py)."""
    low, _ = derived_of(cfg).nodes
    plan = policy.checkpoints(cfg, low, saves)
    return plan.save_s, "measured" if plan.save_how == "measured" else "estimated"


def lead_warning(cfg: RootConfig, saves: Sequence[Row]) -> Optional[str]:
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


def parallel_lines(cfg: RootConfig, world: int) -> list[str]:
    """Tensor parallelism: what a TP rank holds and computes, the communication a step moves,
    and a warning when TP exceeds the key-value heads."""
    d = memory.DTYPE_BYTES[derived_of(cfg).dtype]
    comm = ds_config.precision(cfg, derived_of(cfg).dtype).get("communication_data_type")
    comm = cfg.deepspeed.extra.get("communication_data_type", comm)
    grad = memory.DTYPE_BYTES.get(str(comm), d)
    tp, sp, t = derived_of(cfg).tensor, derived_of(cfg).sequence, cfg.train
    tokens = policy.tokens_per_step(cfg, world) or 0.0
    per_step = flops.flops_per_token(cfg.model, cfg.data.seq_len) * tokens
    seq = int(cfg.data.seq_len)
    lines = [
        parallel_plan.tp_line(cfg.model, tp, world, per_step)
        if sp == 1
        else parallel_plan.sp_line(cfg.model, sp, world, seq, per_step)
    ]
    lines.append(
        parallel_plan.comm_line(
            cfg.model,
            tp=tp,
            world=world,
            stage=int(cfg.deepspeed.stage),
            micro_batch=int(t.micro_batch_size),
            accum=derived_of(cfg).grad_accumulation(world),
            seq_len=int(cfg.data.seq_len),
            dtype_bytes=d,
            grad_bytes=grad,
            checkpointing=bool(cfg.model.activation_checkpointing),
            sp=sp,
        )
    )
    warning = kv_warning(cfg)
    return lines + ([warning] if warning else [])


def placement_text(cfg: RootConfig) -> str:
    """`64 nodes x 8 GPUs = 512 ranks` (`2-4 nodes x 8 GPUs = 16-32 ranks`; CPUs: `2 CPU ranks`)."""
    low, high = derived_of(cfg).nodes
    per_node = derived_of(cfg).per_node
    each = f"{per_node} GPU" if cfg.gpus_per_node else f"{per_node} CPU rank"
    each += "s" if per_node > 1 else ""
    nodes = f"{low}" if low == high else f"{low}-{high}"
    ranks = f"{low * per_node}" if low == high else f"{low * per_node}-{high * per_node}"
    return f"{nodes} node{'s' if high > 1 else ''} x {each} = {ranks} rank{'s' * (high * per_node > 1)}"


def report(cfg: RootConfig, measured_tps: Optional[float] = None) -> PlanReport:
    low, high = derived_of(cfg).nodes
    per_node = derived_of(cfg).per_node
    out = PlanReport()
    n = shapes.params_of(cfg)
    size = f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
    out.lines.append(
        f"plan: {cfg.model.name} ({size} params), ZeRO-{cfg.deepspeed.stage}, "
        f"{derived_of(cfg).dtype}, {placement_text(cfg)}, "
        + shapes.plan_notes(cfg.model, cfg.gpus_per_node)  # attention; MoE: active params
    )
    for n in sorted({low, high}):
        world = n * per_node
        tp, sp = derived_of(cfg).tensor, derived_of(cfg).sequence
        how = "DeepSpeed AutoTP" if sp == 1 else "DeepSpeed Ulysses"
        out.lines.append(
            f"plan: world size {world}: global batch {cfg.train.global_batch_size} = micro "
            f"{cfg.train.micro_batch_size} x grad accumulation {derived_of(cfg).grad_accumulation(world)} x "
            f"data-parallel {derived_of(cfg).data_parallel(world)}"
            + (f" (world {world} / {derived_of(cfg).parallel_text}, {how})" if tp * sp > 1 else "")
        )
    if derived_of(cfg).tensor * derived_of(cfg).sequence > 1:
        out.lines += parallel_lines(cfg, low * per_node)
    if cfg.gpus_per_node > 0:
        memory_lines(cfg, low, out)  # the smallest allocation is the one that must fit
    else:
        mine = memory_plan(cfg, low)
        out.lines.append(f"plan: memory/rank {mine.total / 2**20:.1f} MiB of tensors (CPU ranks)")
        node = host_memory.node_memory(cfg.cluster.kind, cfg.cluster.cpu_mem_gb, low)
        line = host_memory.cpu_ranks_misfit(mine.total, mine.activations,  # as on GPUs: refused
                                            cfg.train.micro_batch_size, per_node, *node)  # fmt: skip
        out.misfit = f"plan does not fit: {line}" if line else None
    checkpoints = policy.checkpoints(cfg, high)  # the most nodes fail most: as policy.py plans
    if cfg.gpus_per_node > 0:
        out.lines.append(checkpoint_line(cfg, high, checkpoints))
        out.lines += local_tier_plan.plan_line(cfg, high, checkpoints)
        out.lines.append(deadline_line(cfg, low))
    if cfg.cluster.kind == "slurm":
        out.lines.append(time_line(cfg))
    out.lines += site_lines(cfg)
    line = eta_line(cfg, low * per_node, measured_tps, checkpoints)
    if line and measured_tps is None and cfg.gpus_per_node > 0:
        out.lines.append(mfu.planned(cfg).line())  # the ETA's MFU and its source: one line
    if line:
        out.lines.append(line)
    advice = policy.stage_env_advice(cfg)  # many nodes: stage the environment node-locally
    if advice:
        out.lines.append(advice)
    warning = corpus_warning(cfg)  # a recipe's tokens over the built-in corpus: say so, once
    if warning:
        out.lines.append(warning)
    return out


def site_lines(cfg: RootConfig) -> list[str]:
    """Where checkpoints go and what the batch shell runs first, when the user set them."""
    from slurmtrain.common.schema_cluster import setup_lines

    out = []
    if cfg.checkpoint.dir:
        out.append(
            f"plan: checkpoints under checkpoint.dir={cfg.checkpoint.dir}/{cfg.name}/ (the run "
            f"directory keeps config, ledger and logs, and links there)"
        )
    lines = setup_lines(cfg.cluster.setup) if cfg.cluster.kind == "slurm" else []
    if lines:
        shown = "; ".join(lines)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        out.append(
            f"plan: cluster.setup: {len(lines)} line{'s' * (len(lines) > 1)} before each "
            f"attempt's first srun ({shown})"
        )
    return out
