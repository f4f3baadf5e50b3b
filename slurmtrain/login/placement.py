"""Where a run goes when the user did not say: `cluster=auto` and `gpus_per_node=auto`.

`python -m slurmtrain model=opt13b nodes=64` must reach Slurm on a login node and run here on a
laptop: Slurm is used when it answers within seconds, else this machine. GPUs per node come from
the partition's GRES/TRES, or `nvidia-smi -L` locally (never a torch import: the login path stays
around a second), else 0; unset per-task resources and `cluster.time=auto` come from the same
partition. One line says which and why. `SLURMTRAIN_AUTO=off`: this machine and CPU ranks (tests
and tools/demo.sh on machines that run Slurm).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Mapping, Optional, TextIO

from slurmtrain.common import slurm_cmd
from slurmtrain.common.commands import run_cmd
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import ClusterKind, RootConfig
from slurmtrain.common.slurm_text import PartitionInfo, SlurmError, mem_mb
from slurmtrain.login.flags import task_defaults
from slurmtrain.planning import cards, policy

ENV = "SLURMTRAIN_AUTO"
PROBE_TIMEOUT_S = 5.0
LOCAL_CPU_TASKS, SLURM_CPU_TASKS = (
    2,
    1,
)  # cpu_tasks_per_node when cluster=auto leaves it to the kind


@dataclass(frozen=True)
class Probe:
    """What this machine can reach: the Slurm partitions (None: no Slurm) and local GPUs."""

    partitions: Optional[dict[str, PartitionInfo]]
    why: str  # why Slurm is (not) used, for the one line
    local_gpus: Optional[int] = None  # filled lazily: nvidia-smi only when needed


_probe_cache: dict[str, Probe] = {}
_said: set[str] = set()
_pending: list[str] = []  # the line, printed by announce() once the command goes ahead
# why the last resolve_auto's cluster=auto chose this machine (a probe's answer): the plan and
# any refusal repeat it, with how to force Slurm (local_why)
_chose_local: dict[str, Optional[str]] = {"why": None}


def probe_slurm(env: Mapping[str, str] = os.environ, honour_off: bool = True) -> Probe:
    """Slurm when sbatch is on PATH and `scontrol ping` says the controller is UP (cached per
    process: a sweep resolves every point, Slurm is asked once). `honour_off=False`: asked even
    under SLURMTRAIN_AUTO=off (an explicit cluster=slurm whose GPUs are the partition's)."""
    off = env.get(ENV, "").lower() == "off"
    key = "slurm-asked" if off and not honour_off else "slurm"
    if key in _probe_cache:
        return _probe_cache[key]
    if off and honour_off:
        probe = Probe(None, f"{ENV}=off")
    elif not shutil.which("sbatch", path=env.get("PATH")):
        probe = Probe(None, "no sbatch on PATH")
    else:
        try:
            pong = slurm_cmd.run(["scontrol", "ping"], timeout=PROBE_TIMEOUT_S)
            if not re.search(r"\bUP\b", pong):
                raise SlurmError(pong.strip().splitlines()[0] if pong.strip() else "no answer")
            probe = Probe(slurm_cmd.query_partitions(), "the Slurm controller answers")
        except SlurmError as err:
            probe = Probe(None, f"sbatch is on PATH but the controller does not answer ({err})")
    _probe_cache[key] = probe
    return probe


def local_gpu_count(env: Mapping[str, str] = os.environ) -> int:
    """GPUs on this machine from `nvidia-smi -L` (one `GPU n: ...` line each), honouring
    CUDA_VISIBLE_DEVICES; 0 when there is no nvidia-smi or it fails."""
    if env.get(ENV, "").lower() == "off":
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not [v for v in visible.split(",") if v.strip()]:
        return 0
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if not exe:
        return 0
    out = run_cmd([exe, "-L"], PROBE_TIMEOUT_S)
    count = parse_nvidia_smi_l(out.out) if out.ok else 0
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def parse_nvidia_smi_l(text: str) -> int:
    """`nvidia-smi -L` -> number of GPUs (MIG instances listed under a GPU are not extra GPUs)."""
    return sum(1 for line in text.splitlines() if re.match(r"GPU \d+:", line))


def chosen_partition(
    name: Optional[str], partitions: Mapping[str, PartitionInfo]
) -> Optional[PartitionInfo]:
    """The partition a job lands in: the named one, else the cluster's default (None: unknown)."""
    if name:
        return partitions.get(name)
    return next((p for p in partitions.values() if p.default), None)


def node_resources(part: PartitionInfo) -> tuple[int, Optional[int], int]:
    """(CPUs per node, memory MiB per node or None, GPUs per node) of a partition (its average:
    the TRES totals over its nodes)."""
    nodes = max(part.total_nodes, 1)
    mem = mem_mb(part.tres.get("mem", "")) if part.tres.get("mem") else None
    return part.total_cpus // nodes, (mem // nodes if mem else None), part.gpus_per_node


def slurm_defaults(cfg: RootConfig, part: PartitionInfo) -> None:
    """Per-task resources left unset, from the partition: login/flags.task_defaults (cores per
    task, --mem=0 or memory per GPU)."""
    task_defaults(cfg, part)


def _choose_kind(cfg: RootConfig, off: bool) -> Optional[str]:
    """cluster=auto: Slurm when its controller answers, else this machine; the "which and why"
    fragment (None: the kind was given). Why it chose this machine is kept for local_why (not
    under SLURMTRAIN_AUTO=off: the line says so itself)."""
    _chose_local["why"] = None
    if cfg.cluster.kind != "auto":
        return None
    probe = probe_slurm()
    cfg.cluster.kind = ClusterKind.slurm if probe.partitions is not None else ClusterKind.local
    if cfg.cluster.kind == "local" and not off:
        _chose_local["why"] = probe.why
    return f"cluster={cfg.cluster.kind} ({local_why() or probe.why})"


def resolve_auto(cfg: RootConfig) -> None:
    """Replace `cluster.kind=auto` / `gpus_per_node=auto` / unset per-task resources by what this
    machine reaches (mutates cfg). The line saying which and why waits for announce(): a command
    refused for bad input stays one line."""
    off = os.environ.get(ENV, "").lower() == "off"
    # SLURMTRAIN_AUTO=off picks this machine and CPU ranks for what is auto; beside an explicit
    # cluster=slurm, gpus_per_node=auto is still the partition's (never CPU ranks on GPU nodes).
    ask = cfg.cluster.kind == "slurm" and cfg.gpus_per_node == "auto"
    said = [kind for kind in (_choose_kind(cfg, off),) if kind]
    if cfg.cluster.cpu_tasks_per_node == 0:  # conf/cluster/auto.yaml: by the chosen kind
        cfg.cluster.cpu_tasks_per_node = (
            SLURM_CPU_TASKS if cfg.cluster.kind == "slurm" else LOCAL_CPU_TASKS
        )
    part, unknown = _partition(cfg, ask)
    if cfg.cluster.time == policy.AUTO:  # the partition's MaxTime, capped (planning/policy.py)
        note = policy.resolve_time(cfg, part, unknown)
        if cfg.cluster.kind == "slurm":
            said.append(f"cluster.time={cfg.cluster.time} ({note})")
    if cfg.gpus_per_node == "auto":
        said.append(_resolve_gpus(cfg, part, off, ask))
    if cfg.cluster.gpu_type == cards.AUTO and part is not None and part.gpu_type:
        if cards.card_key(part.gpu_type):  # a card the planner knows (else: an H100, said)
            cfg.cluster.gpu_type = part.gpu_type
            said.append(f"cluster.gpu_type={part.gpu_type} (partition {part.name}'s GRES)")
    if part is not None:
        slurm_defaults(cfg, part)
    if cfg.cluster.cpus_per_task is None and not (
        isinstance(cfg.gpus_per_node, int) and cfg.gpus_per_node > 0
    ):  # CPU ranks: one core; GPU ranks on an unknown partition: unset (flags.cpus_given)
        cfg.cluster.cpus_per_task = 1
    line = "slurmtrain: auto: " + ", ".join(said)
    if said and line not in _said:  # once per process (a sweep resolves every point)
        _said.add(line)
        _pending.append(line)


def _partition(cfg: RootConfig, ask: bool) -> tuple[Optional[PartitionInfo], str]:
    """The partition a Slurm run lands in, read only when something is left to it (`ask`: even
    under SLURMTRAIN_AUTO=off); else None and why no partition is known, for the time limit."""
    if cfg.cluster.kind != "slurm" or not (
        cfg.gpus_per_node == "auto"
        or cfg.cluster.cpus_per_task is None
        or cfg.cluster.mem_per_gpu is None
        or cfg.cluster.time == policy.AUTO
        or cfg.cluster.gpu_type == cards.AUTO
    ):
        return None, "cluster.kind=local: no time limit applies"
    probe = probe_slurm(honour_off=not ask)
    if probe.partitions is None:
        return None, probe.why
    part = chosen_partition(cfg.cluster.partition, probe.partitions)
    return part, f"Slurm lists no partition {cfg.cluster.partition or '(default)'}"


def _resolve_gpus(cfg: RootConfig, part: Optional[PartitionInfo], off: bool, ask: bool) -> str:
    """gpus_per_node=auto: CPU ranks under SLURMTRAIN_AUTO=off, the partition's GRES on Slurm,
    else nvidia-smi here; returns the "which and why" fragment."""
    known = probe_slurm(honour_off=not ask).partitions if ask else None
    if off and (not ask or known is None):  # off, and no controller to say otherwise
        cfg.gpus_per_node, why = 0, f"{ENV}=off"
    elif cfg.cluster.kind == "slurm":
        if part is None and known is not None:
            raise ConfigError(
                f"cluster.partition={cfg.cluster.partition!r}: "
                + ("unknown partition" if cfg.cluster.partition else "no default partition")
                + f"; set cluster.partition to one of: {', '.join(known) or '(none)'}"
            )
        if part is None:
            raise ConfigError(
                f"gpus_per_node=auto: cannot read partition "
                f"{cfg.cluster.partition or '(default)'}'s GPUs from Slurm "
                f"({probe_slurm().why}); "
                + (
                    f"set gpus_per_node=N, the GPUs of a {cfg.cluster.partition} node"
                    if cfg.cluster.partition
                    else "set gpus_per_node=N or cluster.partition=NAME"
                )
            )
        cfg.gpus_per_node = part.gpus_per_node
        why = f"partition {part.name}'s GRES"
    else:
        cfg.gpus_per_node, why = local_gpu_count(), "nvidia-smi -L"
    return f"gpus_per_node={cfg.gpus_per_node} ({why})"


def local_why(cfg: Optional[RootConfig] = None) -> Optional[str]:
    """Why cluster=auto chose this machine, and how to force Slurm ("no sbatch on PATH;
    cluster=slurm forces Slurm"); None when it did not (or `cfg` is not a local run)."""
    why = _chose_local["why"]
    if why is None or (cfg is not None and cfg.cluster.kind != ClusterKind.local):
        return None
    return f"{why}; cluster=slurm forces Slurm"


def plan_line(cfg: RootConfig) -> Optional[str]:
    """The plan's line naming the executor, when cluster=auto chose this machine."""
    why = local_why(cfg)
    return f"plan: executor local, this machine (cluster=auto: {why})" if why else None


def with_why(refusal: str, cfg: Optional[RootConfig] = None) -> str:
    """A refusal's one line, saying why cluster=auto chose this machine when it did."""
    why = local_why(cfg)
    return f"{refusal} (cluster=auto chose local: {why})" if why else refusal


def announce(out: Optional[TextIO] = None) -> None:
    """Print the pending "which and why" line (once), when the command goes ahead; on stderr, so
    a dry run's stdout stays the config (YAML) and the plan."""
    while _pending:
        print(_pending.pop(0), file=out or sys.stderr)
