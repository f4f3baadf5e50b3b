"""Distributed set-up from whoever started us: torchrun-style variables, Slurm's, or submitit's.

DeepSpeed needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT all set, or it falls back
to MPI discovery; we always set the five ourselves.

LOCAL_RANK is exported as this task's DEVICE INDEX (device_index below), not Slurm's local id:
DeepSpeed uses it as a CUDA ordinal (init_process_group(device_id=cuda:LOCAL_RANK), the engine's
set_device(LOCAL_RANK), ZeRO-3's local device), so where the site binds one GPU per task the
local id 3 would be "invalid device ordinal". Placement.local_rank keeps Slurm's local id.
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
    """The five variables DeepSpeed reads, LOCAL_RANK being this task's device index as far as
    the environment tells it (before torch is imported); rank_device() corrects it once the
    runtime has counted the devices. A binding the environment cannot resolve keeps the local id
    here: rank_device() raises, inside the start-up the ledger records."""
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
    """Non-zero ranks: return as soon as rank 0's TCPStore listens (seconds waited). torch's own
    client retries a refused connect only after a back-off of about a second, so every rank that
    arrives before rank 0 loses up to a second; a connect probe every 20 ms (100 ms past 512 ranks:
    fewer refused SYNs at rank 0's host) ends the wait within a poll. Gives up silently at
    `timeout_s`: init then reports."""
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
    """Tasks on this node (0: unknown): under srun this node's share of the step (an inherited
    LOCAL_WORLD_SIZE from the submitting shell must not win), else torchrun's or submitit's."""
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

    The rule, in order (count = the devices the task sees, tasks = the tasks on this node):
    1. count == 1 -> 0 (one GPU bound to the task);
    2. count >= tasks (or tasks unknown) and count > local_rank -> local_rank (nothing bound);
    3. else this rank's physical GPU (the local_rank-th of SLURM_STEP_GPUS / SLURM_JOB_GPUS)
       at its position in CUDA_VISIBLE_DEVICES (a subset bound per task, e.g. --gpu-bind=closest);
    4. else refuse: no guess (local_rank mod count could put two ranks on one GPU).

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
    """The torch device of this rank. GPU ranks: cuda:device_index(...), and os.environ's
    LOCAL_RANK is set to that index (what DeepSpeed will set_device and pass as device_id).
    CPU ranks: the CPU; when SLURMTRAIN_VISIBLE_DEVICES is set (a list like CUDA_VISIBLE_DEVICES,
    which submitit's local executor blanks on CPU runs) they first run the same device_index
    lookup against it, so tests exercise on CPUs the code a GPU job takes (and fail as it would)."""
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
# The rule: the watchdog (compute/faults/watchdog.py) must always fire before a collective times
# out, because its exit writes what a hang needs (every rank's stacks, the hang record, the
# collectives' flight recorder) and an NCCL timeout aborts the process without them. So:
# - phases with a fixed deadline (start-up: startup_timeout_s; steps, eval: hang_timeout_s): the
#   collective timeout is the longest of them plus a margin (collective_timeout_s below), or
#   faults.collective_timeout_s when that is larger;
# - phases whose deadline restarts on every heartbeat (save, verify, convert, load: one rank
#   writes or converts for as long as it beats while the others wait in a barrier or broadcast)
#   have no fixed bound, so for them the timeout is lifted to LIFTED_S (follow_phase): the
#   watchdog's beats are the only clock, and a 2-hour conversion never races NCCL.
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
    """Fit the default process group's timeout to the phase being entered (the watchdog calls it
    from phase()): lifted for beating phases, the base one otherwise, and never below the
    phase's own deadline plus the margin. A no-op before init, on a change-less call, or where
    torch cannot set it."""
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
    """Write this rank's flight recorder (its last collectives, the one it waits in) where NCCL's
    own timeout dump would go; the watchdog calls it before it exits on a hang, since it fires
    before the collective timeout (see the rule). Returns the path, or None when there is no
    recorder (TORCH_NCCL_TRACE_BUFFER_SIZE unset) or no prefix."""
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
    Ranks of one host share its kernel (an O_APPEND write is whole for all of them) and its
    /dev/shm, so one of them can speak or watch for all: shared-filesystem costs grow with the
    number of hosts, not of ranks."""
    import torch.distributed as dist

    names: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(names, host or socket.gethostname())
    return leads_of(names)


def leads_of(hosts: list[str]) -> list[int]:
    """`hosts[r]`: rank r's host -> for every rank, the lowest rank on the same host."""
    first: dict[str, int] = {}
    return [first.setdefault(h, r) for r, h in enumerate(hosts)]
