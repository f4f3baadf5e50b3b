"""Distributed set-up from whoever started us: torchrun-style variables, Slurm's, or submitit's.

DeepSpeed falls back to MPI discovery unless RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT are all set, so we set the five. LOCAL_RANK is this task's device index (device_index),
not Slurm's local id: DeepSpeed uses it as a CUDA ordinal, and where a site binds one GPU per task
local id 3 would be an "invalid device ordinal". Placement.local_rank keeps Slurm's local id.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Mapping, Optional, TypeVar

from slurmtrain.planning import deadlines

if TYPE_CHECKING:
    import torch

    from slurmtrain.common.schema import FaultsConfig

T = TypeVar("T")


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


def export(p: Placement, env: Optional[Mapping[str, str]] = None) -> None:
    """The five variables DeepSpeed reads, LOCAL_RANK the device index as far as the environment
    tells (before torch is imported); rank_device() corrects it once the devices are counted, and
    raises (inside the recorded start-up) for a binding it cannot resolve."""
    env = os.environ if env is None else env
    os.environ.update(
        RANK=str(p.rank),
        LOCAL_RANK=str(_env_device(env, p.local_rank)),
        WORLD_SIZE=str(p.world_size),
        MASTER_ADDR=p.master_addr,
        MASTER_PORT=str(p.master_port),
    )
    tasks = _local_world(env)
    if tasks:  # torchrun's name for it
        os.environ["LOCAL_WORLD_SIZE"] = str(tasks)


def wait_for_store(p: Placement, timeout_s: float) -> float:
    """Non-zero ranks: return as soon as rank 0's TCPStore listens (seconds waited). torch's client
    backs off about a second after a refused connect; a probe every 20 ms (100 ms past 512 ranks)
    ends the wait within a poll. Gives up silently at `timeout_s`: init then reports."""
    if p.rank == 0:
        return 0.0
    t0 = time.time()
    poll = 0.02 if p.world_size <= 512 else 0.1
    while time.time() - t0 < timeout_s:
        try:
            socket.create_connection((p.master_addr, p.master_port), timeout=5).close()
            break
        except OSError:  # refused (not listening yet), unreachable: try again
            time.sleep(poll)
    return time.time() - t0


def _local_world(env: Mapping[str, str]) -> int:
    """Tasks on this node (0: unknown): under srun the step's share of this node (an inherited
    LOCAL_WORLD_SIZE must not win), else torchrun's or submitit's."""
    if "SLURM_PROCID" in env and "SUBMITIT_LOCAL_JOB_ID" not in env:
        from slurmtrain.common.slurm_text import tasks_per_node

        node, per = env.get("SLURM_NODEID", ""), env.get("SLURM_STEP_TASKS_PER_NODE", "")
        counts = tasks_per_node(per) if per else []
        if node.isdigit() and int(node) < len(counts):
            return counts[int(node)]
        head = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        if head.isdigit():
            return int(head)
    for key in ("LOCAL_WORLD_SIZE", "SUBMITIT_LOCAL_NTASKS"):
        if env.get(key, "").isdigit():
            return int(env[key])
    head = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    return int(head) if head.isdigit() else 0


def _env_device(env: Mapping[str, str], local_rank: int) -> int:
    """device_index from the environment alone: the listed devices (the CPU stand-in's on CPU
    test runs), or the local id when nothing lists them or the list cannot be resolved."""
    listed = env.get(CPU_STAND_IN, env.get("CUDA_VISIBLE_DEVICES"))
    if listed is None or not _ids(listed):
        return local_rank
    try:
        return device_index({**env, "CUDA_VISIBLE_DEVICES": listed}, 0, local_rank)
    except DeviceError:
        return local_rank


# ---- which device is this rank's ----------------------------------------------------------------
class DeviceError(RuntimeError):
    """The rank's device cannot be told from what the task sees."""


def _ids(value: Optional[str]) -> Optional[list[str]]:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def device_index(env: Mapping[str, str], visible_count: int, local_rank: int) -> int:
    """This rank's device index among the devices the task can see (pure: tested without GPUs).

    Sites bind GPUs to tasks (`--gpus-per-task=1`, `--gpu-bind`, cgroups), and then each task sees
    its own GPU as device 0. In order (count = devices seen, tasks = tasks on this node):
    1. count == 1 -> 0 (one GPU bound to the task);
    2. count >= tasks (or tasks unknown) and count > local_rank -> local_rank (nothing bound);
    3. else this rank's physical GPU (the local_rank-th of SLURM_STEP_GPUS / SLURM_JOB_GPUS)
       at its position in CUDA_VISIBLE_DEVICES (a subset bound per task);
    4. else a DeviceError: no guess (local_rank mod count could put two ranks on one GPU).
    `visible_count`: torch.cuda.device_count(), unless CUDA_VISIBLE_DEVICES lists them.
    """
    visible = _ids(env.get("CUDA_VISIBLE_DEVICES"))
    count = len(visible) if visible is not None else visible_count
    local_world = _local_world(env)
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


def rank_device(gpus_per_node: int, env: Mapping[str, str], local_rank: int) -> torch.device:
    """The torch device of this rank: cuda:device_index(...) (and LOCAL_RANK set to that index),
    or the CPU. With SLURMTRAIN_VISIBLE_DEVICES (a CUDA_VISIBLE_DEVICES stand-in, which submitit's
    local executor blanks on CPU runs) CPU ranks run the same lookup, so tests exercise on CPUs
    the code a GPU job takes."""
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
            os.environ["LOCAL_RANK"] = str(index)
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if visible < 1:
        raise DeviceError(
            f"gpus_per_node={gpus_per_node} but this task sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    index = device_index(env, visible, local_rank)
    os.environ["LOCAL_RANK"] = str(index)
    return torch.device("cuda", index)


# ---- collective timeout and flight recorder -------------------------------------------------------
# The watchdog (faults/watchdog.py) must fire before a collective times out: its exit writes what a
# hang needs (stacks, the hang record, the flight recorder), an NCCL timeout aborts without them.
# Fixed-deadline phases (start-up, steps, eval): the timeout is the longest deadline plus a margin,
# or faults.collective_timeout_s if larger. Beating phases (save, verify, convert, load: one rank
# works while the others wait) have no fixed bound: the timeout is lifted to LIFTED_S.
MARGIN_S, MARGIN_FRACTION = deadlines.MARGIN_S, deadlines.MARGIN_FRACTION
LIFTED_S = 7 * 24 * 3600.0
BEATING_PHASES = (deadlines.SAVE, deadlines.VERIFY, deadlines.CONVERT, deadlines.LOAD)
_timeouts: dict[str, float] = {}  # "base": set at init; "now": the process group's current one


def collective_timeout_s(faults: FaultsConfig) -> float:
    """The process group's timeout (init_process_group): see the rule above."""
    fixed = max(float(faults.startup_timeout_s), float(faults.hang_timeout_s))
    rule = fixed + max(MARGIN_S, MARGIN_FRACTION * fixed)
    _timeouts["base"] = _timeouts["now"] = max(rule, float(faults.collective_timeout_s))
    return _timeouts["base"]


def collective_timeout(faults: FaultsConfig) -> timedelta:
    """collective_timeout_s as the timedelta init_process_group takes."""
    return timedelta(seconds=collective_timeout_s(faults))


def follow_phase(name: str, deadline_s: float) -> None:
    """Fit the process group's timeout to the phase being entered (Watchdog.phase): lifted for
    beating phases, the base one otherwise, never below the phase's deadline plus the margin.
    A no-op before init, without a change, or where torch cannot set it."""
    base = _timeouts.get("base")
    if base is None:
        return
    want = LIFTED_S if name in BEATING_PHASES else base
    want = max(want, float(deadline_s) + max(MARGIN_S, MARGIN_FRACTION * float(deadline_s)))
    if want == _timeouts.get("now"):
        return
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _set_pg_timeout

        if not dist.is_initialized():
            return
        _set_pg_timeout(timedelta(seconds=want))
        _timeouts["now"] = want
    except Exception:  # noqa: BLE001  a torch without it keeps the base timeout
        return


TRACE_ENV = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")


def trace_prefix(env: Mapping[str, str]) -> Optional[str]:
    """Where this attempt's flight recorder files go (torch appends the rank): set by the batch
    script to RUN_DIR/logs/nccl_trace.<job>.<restart>.<relaunch>.rank_ (None: not set)."""
    return next((env[k] for k in TRACE_ENV if env.get(k)), None)


def dump_collectives(rank: Optional[int] = None) -> Optional[str]:
    """Write this rank's flight recorder (its last collectives) where NCCL's own timeout dump would
    go: the watchdog fires first, so it calls this. The path, or None without a recorder
    (TORCH_NCCL_TRACE_BUFFER_SIZE unset) or a prefix."""
    prefix = trace_prefix(os.environ)
    if prefix is None:
        return None
    import torch

    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_nccl_trace", None) or getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return None
    data = dump()
    if not data:
        return None
    path = f"{prefix}{os.environ.get('RANK', '0') if rank is None else rank}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


def broadcast(obj: T) -> T:
    """Rank 0's (picklable) object on every rank (what the others pass is only a placeholder)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def host_leads(host: Optional[str] = None) -> list[int]:
    """Collective: for every rank, the lowest rank on its host (one all_gather of host names).
    One rank can speak or watch for its host (shared kernel and /dev/shm): shared-filesystem
    costs then grow with hosts, not ranks."""
    import torch.distributed as dist

    names: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(names, host or socket.gethostname())
    return leads_of(names)


def leads_of(hosts: list[str]) -> list[int]:
    """`hosts[r]`: rank r's host -> for every rank, the lowest rank on the same host."""
    first: dict[str, int] = {}
    return [first.setdefault(h, r) for r, h in enumerate(hosts)]
