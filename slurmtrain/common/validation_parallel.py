"""Tensor parallelism's checks at login (parallel.tensor): one line naming key, value and fix.

TP is DeepSpeed AutoTP within a node: its groups are consecutive ranks (DeepSpeed's mesh is
data-parallel x tensor-parallel), so the degree must divide the ranks per node, and the attention
heads. TP above the key-value heads runs with empty shards: a warning (kv_warning), not a refusal.
ZeRO-0 and ZeRO-3 with TP train (TP 2 x DP 2 equal to TP=1) but their checkpoints do not convert
to DeepSpeed's universal form, which export and a world-size change need: refused until they do.

SP (parallel.sequence) is DeepSpeed Ulysses: each rank of an SP group holds 1/SP of every sequence,
and its attention swaps sequence shards for head shards (all-to-all) around the attention kernel,
so the sequence must split evenly, the query heads too, and the key-value heads either split or
replicate evenly. Ulysses drops the attention mask (causality comes from the kernel's is_causal),
which eager attention cannot do: refused. TP x SP is refused: AutoTP's and Ulysses' process groups
are two meshes DeepSpeed 0.19.8 does not combine (each replaces the other's data-parallel group).
"""

from __future__ import annotations

from typing import Optional

from slurmtrain.common.derived import tasks_per_node, tp_choices
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.hf_config import attention
from slurmtrain.common.schema import RootConfig


def check_parallel(cfg: RootConfig) -> None:
    """parallel.tensor is a whole number within a node that divides the heads; parallel.sequence
    (check_sequence) splits the sequence and the heads evenly."""
    check_sequence(cfg)
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


def check_sequence(cfg: RootConfig) -> None:
    """parallel.sequence: a whole number that splits data.seq_len and the heads, with an attention
    kernel Ulysses can wrap, and no tensor parallelism beside it."""
    sp = getattr(cfg.parallel, "sequence", 1)
    if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
        raise ConfigError(
            f"parallel.sequence={sp!r}: must be a whole number >= 1 (1: no sequence parallelism); "
            f"e.g. parallel.sequence=2"
        )
    if sp == 1:
        return
    tp = int(cfg.parallel.tensor)
    if tp > 1:
        raise ConfigError(
            f"parallel.sequence={sp} with parallel.tensor={tp}: not supported together (DeepSpeed "
            f"0.19.8's AutoTP and Ulysses groups do not combine); use parallel.tensor=1 or "
            f"parallel.sequence=1"
        )
    used = attention(cfg.model, int(cfg.gpus_per_node))
    if used == "eager":
        raise ConfigError(
            f"parallel.sequence={sp} with model.attn_implementation={cfg.model.attn_implementation} "
            f"(eager for {cfg.model.family}): DeepSpeed Ulysses cannot wrap eager attention (it "
            f"needs the full attention mask); use model.attn_implementation=sdpa (or "
            f"flash_attention_2 on GPUs), or parallel.sequence=1"
        )
    seq = int(cfg.data.seq_len)
    if seq % sp:
        fit = [s for s in (seq - seq % sp, seq - seq % sp + sp) if s > 0]
        raise ConfigError(
            f"parallel.sequence={sp}: must divide data.seq_len={seq} (each rank holds an equal "
            f"slice); use data.seq_len={' or '.join(map(str, fit))}, or a parallel.sequence "
            f"that divides {seq}"
        )
    heads = int(cfg.model.num_heads)
    kv = int(cfg.model.num_kv_heads or heads)
    if heads % sp or (kv % sp and sp % kv):
        choices = "|".join(
            str(d) for d in range(1, heads + 1) if heads % d == 0 and (kv % d == 0 or d % kv == 0)
        )
        raise ConfigError(
            f"parallel.sequence={sp}: must divide model.num_heads={heads} and divide or be a "
            f"multiple of model.num_kv_heads={kv} (Ulysses gives each rank whole heads); use "
            f"parallel.sequence={choices}"
        )
