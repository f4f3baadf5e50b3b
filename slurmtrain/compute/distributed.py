"""Distributed set-up from whoever started us: torchrun-style variables, Slurm's, or submitit's.

DeepSpeed needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT all set, or it falls back
to MPI discovery; we always set the five ourselves.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping, Optional


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
        return Placement(int(rv["RANK"]), int(rv["LOCAL_RANK"]), int(rv["WORLD_SIZE"]),
                         rv["MASTER_ADDR"], int(rv["MASTER_PORT"]), env.get("SLURM_JOB_ID"),
                         env.get("SLURMD_NODENAME", host))
    if "SUBMITIT_LOCAL_GLOBALID" in env:
        return Placement(int(env["SUBMITIT_LOCAL_GLOBALID"]), int(env["SUBMITIT_LOCAL_LOCALID"]),
                         int(env["SUBMITIT_LOCAL_NTASKS"]), "127.0.0.1",
                         int(env.get("MASTER_PORT", default_port)),
                         env.get("SUBMITIT_LOCAL_JOB_ID"), host)
    return Placement(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)),
                     int(env.get("WORLD_SIZE", 1)), env.get("MASTER_ADDR", "127.0.0.1"),
                     int(env.get("MASTER_PORT", default_port)), env.get("JOB_ID"), host)


def export(p: Placement) -> None:
    os.environ.update(RANK=str(p.rank), LOCAL_RANK=str(p.local_rank),
                      WORLD_SIZE=str(p.world_size), MASTER_ADDR=p.master_addr,
                      MASTER_PORT=str(p.master_port))
