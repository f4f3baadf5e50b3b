"""Tensor and sequence parallelism on the compute side: which batch a rank reads (its data-parallel
coordinates), DeepSpeed's groups (the mpu), and a sequence-parallel rank's slice and loss.

DeepSpeed AutoTP shards the model inside `deepspeed.initialize` ("tensor_parallel": {"autotp_size":
N} in the ds config, common/ds_config.py) over a (data-parallel, tensor-parallel) mesh of
consecutive ranks. Every rank of a TP group must read the same batch, so the sampler and the
validation windows are sharded by the data-parallel rank and size DeepSpeed set up
(deepspeed.utils.groups), not by the global rank and world.

Sequence parallelism (parallel.sequence=N) is DeepSpeed Ulysses (`UlyssesSPAttentionHF`): SP
groups are N consecutive ranks; they read one batch as a TP group does, and each rank feeds the
model its 1/N slice of every sequence with the slice's global position_ids. Ulysses replaces the
attention kernel transformers calls with one that all-to-alls the slices into whole sequences of
1/N of the heads and back. The loss (`sequence_loss`) is computed here from the slice's logits:
each rank backpropagates its tokens' loss sum / the group's token count (DeepSpeed sums gradients
over the SP group and averages over data parallelism; x SP under ZeRO-3, SequenceShard.grad_scale), and the value it reports is the group's
sum of token losses / count, all-reduced (an autograd all-gather fails on gloo subgroups).
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Any, Optional

import torch

from slurmtrain.common.derived import sequence_parallel, tensor_parallel
from slurmtrain.common.schema import RootConfig


def data_coords(cfg: RootConfig, rank: int, world: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size) of this rank; after `deepspeed.initialize`."""
    tp, sp = tensor_parallel(cfg), sequence_parallel(cfg)
    if sp > 1:
        shard = sequence_shard(cfg)
        assert shard is not None and shard.rank == rank % sp, (shard, rank, sp)
        return rank // sp, world // sp  # SP groups: `sp` consecutive ranks (parallel_state_sp)
    if tp <= 1:
        return rank, world
    from deepspeed.utils import groups

    dp_rank = int(groups.get_data_parallel_rank())
    dp_world = int(groups.get_data_parallel_world_size())
    # DeepSpeed's mesh is (data, tensor): a TP group is `tp` consecutive ranks, within a node.
    assert (dp_rank, dp_world) == (rank // tp, world // tp), (dp_rank, dp_world, rank, world, tp)
    return dp_rank, dp_world


# Ulysses' groups and its attention wrapper are process-wide: registered once, however many times
# the model is built (ZeRO-3 builds under zero.Init, which wants the mpu too, before initialize).
_ULYSSES: dict[str, Any] = {}


def mpu(cfg: RootConfig) -> object:
    """`deepspeed.initialize(mpu=...)`: under TP, DeepSpeed's own groups, set up first, so its
    config checks the batch against the data-parallel size (without an mpu it takes the world);
    under SP, Ulysses' groups (registered with transformers on first use)."""
    if sequence_parallel(cfg) > 1:
        return _ulysses(cfg)
    tp = tensor_parallel(cfg)
    if tp <= 1:
        return None
    from deepspeed.utils import groups

    groups._init_tp_mesh_device(tensor_model_parallel_size=tp)  # the engine reuses these groups
    return groups


def _ulysses(cfg: RootConfig) -> object:
    if "mpu" not in _ULYSSES:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

        from slurmtrain.common.hf_config import attention
        from slurmtrain.compute.model import model_config

        config = copy.copy(model_config(cfg))
        # Ulysses reads num_key_value_heads, which OPT's config does not have (MHA: all heads)
        if getattr(config, "num_key_value_heads", None) is None:
            config.num_key_value_heads = config.num_attention_heads
        groups = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=types.SimpleNamespace(config=config),  # "a loaded model"
            core_attn_implementation=attention(cfg.model, int(cfg.gpus_per_node)),
            sequence_parallel_size=sequence_parallel(cfg),
            micro_batch_size=int(cfg.train.micro_batch_size),
            seq_length=int(cfg.data.seq_len),
            seq_length_is_variable=True,  # evaluation's last batch may hold fewer windows
        )
        _ULYSSES["mpu"] = _UlyssesGroups(groups)
    return _ULYSSES["mpu"]


class _UlyssesGroups:
    """Ulysses' mpu (deepspeed parallel_state_sp) plus a tensor-parallel size of 1. Without it
    DeepSpeed 0.19.8 takes the model-parallel size (= SP there) for TP: every checkpoint records
    tp_degree=SP beside its one model file, and ds_to_universal (a resume on another world size,
    export) refuses it. Everything else (the SP rank as the model-parallel rank, which its norms
    count replicated parameters by) is the module's own."""

    def __init__(self, module: object) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @staticmethod
    def get_tensor_model_parallel_world_size() -> int:
        return 1


@dataclass(frozen=True)
class SequenceShard:
    """This rank's place in its SP group."""

    rank: int
    size: int
    group: Any  # the torch.distributed process group of the SP ranks
    # What the backward loss is multiplied by: ZeRO-3 (DeepSpeed 0.19.8) ends up with gradients
    # and a global norm 1/SP of the true ones under Ulysses (measured: norm 1.27 at SP=4 where
    # SP=1 has 5.06), so gradient clipping would cut at SP x optim.grad_clip; ZeRO 0-2 are exact.
    grad_scale: float = 1.0


def sequence_shard(cfg: RootConfig) -> Optional[SequenceShard]:
    """None without sequence parallelism; after `mpu(cfg)` (the groups exist)."""
    if sequence_parallel(cfg) <= 1:
        return None
    groups: Any = _ulysses(cfg)
    size = int(groups.get_sequence_parallel_world_size())
    return SequenceShard(
        int(groups.get_sequence_parallel_rank()),
        size,
        groups.get_sequence_parallel_group(),
        float(size) if int(cfg.deepspeed.stage) == 3 else 1.0,
    )


def local_slice(window: torch.Tensor, shard: SequenceShard) -> tuple[torch.Tensor, ...]:
    """(inputs, labels, position_ids) of this rank's slice of `window` (inputs window[:, :-1],
    labels window[:, 1:]); the positions are the slice's place in the whole sequence."""
    tokens = window.size(1) - 1
    chunk = tokens // shard.size
    start, stop = shard.rank * chunk, (shard.rank + 1) * chunk
    positions = torch.arange(start, stop, device=window.device).expand(window.size(0), -1)
    return window[:, start:stop], window[:, start + 1 : stop + 1], positions


def slice_losses(
    model: torch.nn.Module, window: torch.Tensor, shard: SequenceShard
) -> torch.Tensor:
    """Per-token cross entropy of this rank's slice, (micro batch, tokens / SP), in fp32."""
    from slurmtrain.compute.model import token_losses

    inputs, labels, positions = local_slice(window, shard)
    logits = model(input_ids=inputs, position_ids=positions).logits
    return token_losses(logits, labels)


def sequence_loss(
    model: torch.nn.Module, window: torch.Tensor, shard: SequenceShard
) -> tuple[torch.Tensor, torch.Tensor]:
    """(what this rank backpropagates, the micro batch's mean loss over the whole sequences: the
    same on every rank of the SP group, detached)."""
    import torch.distributed as dist

    local = slice_losses(model, window, shard).sum()
    count = window.size(0) * ((window.size(1) - 1) // shard.size)  # windows are never padded
    totals = torch.stack([local.detach(), local.new_tensor(float(count))])
    dist.all_reduce(totals, group=shard.group)
    loss_sum, count = totals[0], totals[1]
    return local * (shard.grad_scale / count), loss_sum / count
