"""Distributed set-up from whoever started us: torchrun-style variables, Slurm's, or submitit's.

DeepSpeed needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT all set, or it falls back
to MPI discovery; we always set the five ourselves.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class Placement:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    job_id: Optional[str]
    node: str


def placement(env: Mapping[str, str], default_port: int = 29500) -> Placement:
    host = socket.gethostname()
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SUBMITIT_LOCAL_JOB_ID" not in env:
        from slurmtrain.common.slurm_text import rendezvous_from_env

        rv = rendezvous_from_env(env)
        return Placement(
            int(rv["RANK"]),
            int(rv["LOCAL_RANK"]),
            int(rv["WORLD_SIZE"]),
            rv["MASTER_ADDR"],
            int(rv["MASTER_PORT"]),
            env.get("SLURM_JOB_ID"),
            env.get("SLURMD_NODENAME", host),
        )
    if "SUBMITIT_LOCAL_GLOBALID" in env:
        return Placement(
            int(env["SUBMITIT_LOCAL_GLOBALID"]),
            int(env["SUBMITIT_LOCAL_LOCALID"]),
            int(env["SUBMITIT_LOCAL_NTASKS"]),
            "127.0.0.1",
            int(env.get("MASTER_PORT", default_port)),
            env.get("SUBMITIT_LOCAL_JOB_ID"),
            host,
        )
    return Placement(
        int(env.get("RANK", 0)),
        int(env.get("LOCAL_RANK", 0)),
        int(env.get("WORLD_SIZE", 1)),
        env.get("MASTER_ADDR", "127.0.0.1"),
        int(env.get("MASTER_PORT", default_port)),
        env.get("JOB_ID"),
        host,
    )


def export(p: Placement) -> None:
    os.environ.update(
        RANK=str(p.rank),
        LOCAL_RANK=str(p.local_rank),
        WORLD_SIZE=str(p.world_size),
        MASTER_ADDR=p.master_addr,
        MASTER_PORT=str(p.master_port),
    )


# ---- which device is this rank's ----------------------------------------------------------------
class DeviceError(RuntimeError):
    """The rank's device cannot be told from what the task sees."""


def _ids(value: Optional[str]) -> Optional[list[str]]:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def device_index(env: Mapping[str, str], visible_count: int, local_rank: int) -> int:
    """This rank's device index among the devices the task can see (pure: tested without GPUs).

    Why not simply `local_rank`: sites bind GPUs to tasks (`--gpus-per-task=1`, `--gpu-bind`,
    cgroup ConstrainDevices), and then every task sees its own GPU as device 0 and `cuda:1` is an
    "invalid device ordinal". The cases:
    - one device visible: it is this rank's (index 0);
    - at least as many visible as tasks on this node: none bound, the local rank's (index local_rank);
    - some other subset: the step's GPUs (SLURM_STEP_GPUS / SLURM_JOB_GPUS, physical ids, one per
      task) give this rank's physical id, found in CUDA_VISIBLE_DEVICES when that lists physical ids;
    - otherwise a DeviceError naming what was seen and the fix.
    `visible_count` is what the runtime counts (torch.cuda.device_count()); CUDA_VISIBLE_DEVICES,
    when set, is the list it counted.
    """
    visible = _ids(env.get("CUDA_VISIBLE_DEVICES"))
    count = len(visible) if visible is not None else visible_count
    local_world = int(
        env.get("LOCAL_WORLD_SIZE")
        or env.get("SUBMITIT_LOCAL_NTASKS")
        or env.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0]
        or 0
    )
    if count == 1:
        return 0
    if count > local_rank and (local_world == 0 or count >= local_world):
        return local_rank
    step = _ids(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    if visible and step and local_rank < len(step):
        mine = sorted(step, key=lambda s: (len(s), s))[local_rank]
        if mine in visible:
            return visible.index(mine)
    raise DeviceError(
        f"local rank {local_rank} of {local_world or '?'} tasks on this node sees {count} devices "
        f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}, SLURM_STEP_GPUS="
        f"{env.get('SLURM_STEP_GPUS')!r}): cannot tell which is its own; let each task see one GPU "
        f"(srun --gpus-per-task=1 / --gpu-bind=single:1) or all of the node's"
    )


CPU_STAND_IN = "SLURMTRAIN_VISIBLE_DEVICES"


def rank_device(gpus_per_node: int, env: Mapping[str, str], local_rank: int) -> Any:
    """The torch device of this rank. GPU ranks: cuda:device_index(...). CPU ranks: the CPU; when
    SLURMTRAIN_VISIBLE_DEVICES is set (a list like CUDA_VISIBLE_DEVICES, which submitit's local
    executor blanks on CPU runs) they first run the same device_index lookup against it, so tests
    exercise on CPUs the code a GPU job takes (and fail as it would)."""
    import torch

    if gpus_per_node == 0:
        stand_in = env.get(CPU_STAND_IN)
        if stand_in is not None:
            index = device_index({**env, "CUDA_VISIBLE_DEVICES": stand_in}, 0, local_rank)
            print(
                f"slurmtrain: local rank {local_rank}: device {index} of {stand_in!r} "
                f"({CPU_STAND_IN}; CPU rank)",
                flush=True,
            )
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if visible < 1:
        raise DeviceError(
            f"gpus_per_node={gpus_per_node} but this task sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    return torch.device("cuda", device_index(env, visible, local_rank))


def broadcast(obj: Any) -> Any:
    """Rank 0's (picklable) object on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def host_leads(host: Optional[str] = None) -> list[int]:
    """Collective: for every rank, the lowest rank on its host (one all_gather of host names).
    Ranks of one host share its kernel (an O_APPEND write is whole for all of them) and its
    /dev/shm, so one of them can speak or watch for all: shared-filesystem costs grow with the
    number of hosts, not of ranks."""
    import torch.distributed as dist

    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, host or socket.gethostname())
    return leads_of(names)


def leads_of(hosts: list[str]) -> list[int]:
    """`hosts[r]`: rank r's host -> for every rank, the lowest rank on the same host."""
    first: dict[str, int] = {}
    return [first.setdefault(h, r) for r, h in enumerate(hosts)]
