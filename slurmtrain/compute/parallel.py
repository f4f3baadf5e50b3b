"""Tensor parallelism on the compute side: which batch a rank reads (its data-parallel coordinates).

DeepSpeed AutoTP shards the model inside `deepspeed.initialize` ("tensor_parallel": {"autotp_size":
N} in the ds config, common/ds_config.py) over a (data-parallel, tensor-parallel) mesh of
consecutive ranks. Every rank of a TP group must read the same batch, so the sampler and the
validation windows are sharded by the data-parallel rank and size DeepSpeed set up
(deepspeed.utils.groups), not by the global rank and world.
"""

from __future__ import annotations

from slurmtrain.common.derived import tensor_parallel
from slurmtrain.common.schema import RootConfig


def data_coords(cfg: RootConfig, rank: int, world: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size) of this rank; after `deepspeed.initialize`."""
    tp = tensor_parallel(cfg)
    if tp <= 1:
        return rank, world
    from deepspeed.utils import groups

    dp_rank = int(groups.get_data_parallel_rank())
    dp_world = int(groups.get_data_parallel_world_size())
    # DeepSpeed's mesh is (data, tensor): a TP group is `tp` consecutive ranks, within a node.
    assert (dp_rank, dp_world) == (rank // tp, world // tp), (dp_rank, dp_world, rank, world, tp)
    return dp_rank, dp_world


def mpu(cfg: RootConfig) -> object:
    """`deepspeed.initialize(mpu=...)`: under TP, DeepSpeed's own groups, set up first, so its
    config checks the batch against the data-parallel size (without an mpu it takes the world)."""
    tp = tensor_parallel(cfg)
    if tp <= 1:
        return None
    from deepspeed.utils import groups

    groups._init_tp_mesh_device(tensor_model_parallel_size=tp)  # the engine reuses these groups
    return groups
