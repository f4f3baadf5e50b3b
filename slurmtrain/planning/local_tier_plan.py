"""The node-local checkpoint tier's default interval: `checkpoint.local_every_steps=auto`.

On GPUs with more than one node, auto is Young/Daly's interval sqrt(2 x local save x job MTBF) in
steps of the planned step time, as the shared interval is planned (planning/policy.py). A local save
is synchronous (compute/checkpoint/local_tier.py): the loop waits for the node's bytes written to
node-local storage, the buddy copy through the process group, and a save's fixed costs. Its cost
comes from rates measured by bench/local_tier_rates.py, scaled to the plan's bytes per node, and
the fixed part bench/local_tier_drill.py measured. One node (no buddy to copy to), CPU ranks
(demos, tests) and an interval no shorter than the shared tier's (it would bound no more lost
work) keep 0: the shared tier only.
Pure arithmetic and config: no torch, no Slurm calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.planning import ckpt_interval, deadlines


class CheckpointPlan(Protocol):
    """What this module reads of planning/policy.py's CheckpointPlan (policy imports this one)."""

    @property
    def layout(self) -> deadlines.Layout: ...
    @property
    def mtbf_s(self) -> float: ...
    @property
    def step_s(self) -> Optional[float]: ...
    def chosen_s(self, cfg: RootConfig) -> Optional[float]: ...


AUTO = "auto"
# Measured by bench/local_tier_rates.py (bench/results/local_tier_rates.txt, its MB/s of one node):
# torch.save + CRC-32 + fsync into /dev/shm, and compute/checkpoint/buddy.py's ring over gloo.
RATES_SOURCE = "bench/results/local_tier_rates.txt"
LOCAL_WRITE_BPS = 1369.7e6
BUDDY_COPY_BPS = 542.9e6
LOCAL_READ_BPS = 1382.8e6
# bench/local_tier_drill.py (bench/results/local_tier_fixed.txt): the median local save of opt_tiny
# (bytes negligible), collectives, manifest, seal, renames and fsyncs on 2 nodes.
FIXED_SOURCE = "bench/results/local_tier_fixed.txt"
LOCAL_FIXED_S = 0.046


@dataclass(frozen=True)
class LocalPlan:
    """The local tier's planned interval and what it is made of (seconds, bytes)."""

    every_steps: int  # 0: off
    why: str  # where the value came from, for the plan's line
    node_bytes: float = 0.0  # one node's ranks' shards: what a local save writes and copies
    save_s: float = 0.0  # what the loop waits per local save
    interval_s: float = 0.0  # Young/Daly's optimum on save_s


def local_save_seconds(node_bytes: float) -> float:
    """The loop's wait for one local save: write, buddy copy (after it), the fixed costs."""
    return node_bytes / LOCAL_WRITE_BPS + node_bytes / BUDDY_COPY_BPS + LOCAL_FIXED_S


def plan(cfg: RootConfig, nodes: int, ckpt: CheckpointPlan) -> LocalPlan:
    """What `local_every_steps=auto` means for this run on `nodes` nodes."""
    if cfg.gpus_per_node == 0:
        return LocalPlan(0, "CPU ranks: demos and tests keep the shared tier only")
    if nodes < 2:
        return LocalPlan(0, "one node: no buddy node to hold a copy")
    node_bytes = float(ckpt.layout.save.node)  # the busiest node's ranks
    save = local_save_seconds(node_bytes)
    tau = ckpt_interval.young_daly_interval(save, ckpt.mtbf_s)
    if not ckpt.step_s:
        why = "no step-time estimate to count steps by: set checkpoint.local_every_steps=K"
        return LocalPlan(0, why, node_bytes, save, tau)
    steps, shared = max(1, round(tau / ckpt.step_s)), ckpt.chosen_s(cfg)
    if shared and steps * ckpt.step_s >= shared:
        why = (
            f"Young/Daly's {tau / 60:.1f} min on a {save:.1f} s local save is no shorter than the "
            f"shared tier's {shared / 60:.1f} min: it would bound no more lost work"
        )
        return LocalPlan(0, why, node_bytes, save, tau)
    return LocalPlan(steps, "Young/Daly", node_bytes, save, tau)


def resolve(cfg: RootConfig, ckpt: Optional[CheckpointPlan]) -> None:
    """Fill `checkpoint.local_every_steps=auto` (mutates cfg); `ckpt`: the plan at the most
    nodes (None where no plan is needed: CPU ranks or one node)."""
    c = cfg.checkpoint
    if c.local_every_steps == AUTO:
        high = derived_of(cfg).nodes[1]
        c.local_every_steps = plan(cfg, high, ckpt).every_steps if ckpt else 0
    value = c.local_every_steps
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"checkpoint.local_every_steps={value!r}: must be a whole number of steps >= 0 "
            f"(0: no node-local tier) or auto; e.g. checkpoint.local_every_steps=50"
        )


def needs_plan(cfg: RootConfig) -> bool:
    """Whether auto needs the checkpoint plan (GPUs on more than one node)."""
    return cfg.gpus_per_node > 0 and derived_of(cfg).nodes[1] > 1


def plan_line(cfg: RootConfig, nodes: int, ckpt: CheckpointPlan) -> list[str]:
    """The plan's line for the local tier (none for a single node left at its default)."""
    k, auto = int(cfg.checkpoint.local_every_steps), plan(cfg, nodes, ckpt)
    if nodes < 2 and k == 0:
        return []
    if k == 0:
        why = "set by hand" if auto.every_steps else auto.why
        return [f"plan: node-local checkpoints off (checkpoint.local_every_steps=0: {why})"]
    how = "auto: Young/Daly" if k == auto.every_steps else f"set by hand; auto: {auto.every_steps}"
    minutes = f" ~{k * ckpt.step_s / 60:.1f} min," if ckpt.step_s else ""
    line = (
        f"plan: node-local checkpoints every {k} steps ({minutes} {how} sqrt(2 x local save "
        f"{auto.save_s:.1f} s x job MTBF {ckpt.mtbf_s / 3600:.1f} h) = "
        f"{auto.interval_s / 60:.1f} min): the loop waits {auto.save_s:.1f} s a save = "
        f"{auto.node_bytes / 1e9:.2f} GB a node written at {LOCAL_WRITE_BPS / 1e6:.0f} MB/s + "
        f"its buddy copy at {BUDDY_COPY_BPS / 1e6:.0f} MB/s ({RATES_SOURCE}, measured) + "
        f"{LOCAL_FIXED_S:.1f} s fixed ({FIXED_SOURCE}, measured); work lost to a "
        f"failure is bounded by this interval unless the node and its buddy both fail within it"
    )
    shared = ckpt.chosen_s(cfg)
    if shared and ckpt.step_s and k * ckpt.step_s >= shared:
        line += (
            f"; no shorter than the shared tier's {shared / 60:.0f} min: it bounds no more lost "
            f"work, only restarts read from node-local storage"
        )
    return [line.replace("( ", "(")]
