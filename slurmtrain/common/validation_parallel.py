"""Tensor parallelism's checks at login (parallel.tensor): one line naming key, value and fix.

TP is DeepSpeed AutoTP within a node: its groups are consecutive ranks (DeepSpeed's mesh is
data-parallel x tensor-parallel), so the degree must divide the ranks per node, and the attention
heads. TP above the key-value heads runs with empty shards: a warning (kv_warning), not a refusal.
ZeRO-0 and ZeRO-3 with TP train (TP 2 x DP 2 equal to TP=1) but their checkpoints do not convert
to DeepSpeed's universal form, which export and a world-size change need: refused until they do.
"""

from __future__ import annotations

from typing import Optional

from slurmtrain.common.derived import tasks_per_node, tp_choices
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig


def check_parallel(cfg: RootConfig) -> None:
    """parallel.tensor is a whole number within a node that divides the heads."""
    tp = cfg.parallel.tensor
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(
            f"parallel.tensor={tp!r}: must be a whole number >= 1 (1: no tensor parallelism); "
            f"e.g. parallel.tensor=2"
        )
    if tp == 1:
        return
    per_node = tasks_per_node(cfg)
    where = (
        f"gpus_per_node={cfg.gpus_per_node}"
        if int(cfg.gpus_per_node) > 0
        else f"cluster.cpu_tasks_per_node={per_node}"
    )
    choices = "|".join(str(t) for t in tp_choices(cfg))
    if tp > per_node or per_node % tp:
        raise ConfigError(
            f"parallel.tensor={tp}: tensor parallelism stays within a node, whose {per_node} "
            f"ranks ({where}) it must divide; use parallel.tensor={choices}"
        )
    stage = int(cfg.deepspeed.stage)
    if stage not in (1, 2):
        why = (
            "fails on the AutoTP shards' recorded shapes"
            if stage == 3
            else "needs the ZeRO optimizer files ZeRO-0 does not write"
        )
        raise ConfigError(
            f"parallel.tensor={tp} with deepspeed.stage={stage}: DeepSpeed 0.19.8 trains it but "
            f"cannot convert its checkpoints to the universal form that export and a resume on "
            f"another world size read (ds_to_universal {why}); use deepspeed=zero1 or "
            f"deepspeed=zero2 (TP already divides the layers' params by {tp}) or parallel.tensor=1"
        )
    heads = int(cfg.model.num_heads)
    if heads % tp:
        raise ConfigError(
            f"parallel.tensor={tp}: must divide model.num_heads={heads} (each TP rank holds "
            f"whole heads); use parallel.tensor={choices}"
        )


def kv_warning(cfg: RootConfig) -> Optional[str]:
    """TP above the key-value heads: DeepSpeed runs it with some ranks' kv shards empty."""
    tp, kv = int(cfg.parallel.tensor), cfg.model.num_kv_heads
    if tp > 1 and kv is not None and tp > int(kv):
        return (
            f"warning: parallel.tensor={tp} exceeds model.num_kv_heads={kv}: DeepSpeed's AutoTP "
            f"leaves some ranks' key-value shards empty (it trains, the kv weights are not split "
            f"evenly); parallel.tensor<={kv} splits them"
        )
    return None
