"""The health gate: a quick check of every node before the model is loaded.

A node with a broken GPU, wrong arithmetic or a slow link costs a whole job. Each rank checks its
devices, a matmul against a float64 reference, free device memory, and times all-reduces: within
its node, between node pairs (one rank a node), and over the world; a failing or much slower node,
or a link below its fabric's floor (fabric.py), goes to the run's bad-node ledger so the next
attempt excludes it. Before those, each node's lowest rank checks the run's mounts
(common/storage_probe.py) and, on NVIDIA nodes, ECC / XID / throttling (common/gpu_health.py): a failing node
goes to the ledger as `storage: ...`, `ecc: ...`, `xid: ...` or `throttle: ...`.
Healthy nodes must pass: timed calls are warmed up, timed with device events after a synchronize,
the all-reduce starts after a barrier, and the matmul tolerance admits TF32.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TypedDict

import torch
import torch.distributed as dist

from slurmtrain.common import gpu_health, storage_probe
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute.faults import fabric
from slurmtrain.compute.faults.fabric import Fabric


@dataclass
class RankHealth:
    node: str
    rank: int
    ok: bool
    reason: str
    matmul_s: float
    allreduce_s: float
    allreduce_gbps: float = 0.0  # bus bandwidth of the timed all-reduce (nccl-tests' busbw)
    free_gib: float = -1.0  # device memory free before loading (-1: not a GPU)
    intra_gbps: float = 0.0  # all-reduce among its node's ranks (0: alone on its node)
    pair_gbps: dict[str, float] = field(default_factory=dict)  # node lead: partner node -> GB/s
    intra: Fabric = fabric.Fabric("gloo (CPU)", 0.0)
    inter: Fabric = fabric.Fabric("gloo (CPU)", 0.0)
    node_check_s: float = 0.0  # the node lead's storage and NVML checks (0: not the lead)


class Figures(TypedDict, total=False):
    """What `health_ok` records of the links: bus GB/s (the slowest node, the slowest pair)."""

    allreduce_gbps: float  # over the world (rank 0's timing)
    intra_node_gbps: float
    inter_node_gbps: float
    fabric: str  # "intra-node / inter-node", e.g. "NVLink / InfiniBand"
    node_checks_s: float  # the slowest node's storage and NVML checks


@dataclass
class Verdict:
    """The gate's outcome: the nodes it failed and the figures it recorded."""

    bad: list["BadNode"]
    figures: Figures


class BadNode(TypedDict):
    """A node the gate failed: a row of the run's bad-node ledger."""

    node: str
    rank: int
    reason: str


MATMUL_N = 512
# fp32 inputs, fp64 reference: the relative error of a correct fp32 GEMM of size n is ~1e-6; TF32
# (torch.backends.cuda.matmul.allow_tf32, or NVIDIA_TF32_OVERRIDE=1) rounds inputs to 10 mantissa
# bits, ~1e-3. The bound passes both and still fails a broken unit (errors of order 1).
MATMUL_TOL = 2e-2
ALLREDUCE_BYTES = 256 * 2**20  # big enough that NVLink/InfiniBand and a TCP fallback differ ~100x
CPU_ALLREDUCE_BYTES = 4 * 2**20  # gloo on CPUs: the test only proves the collective works
MIN_FREE_FRACTION = 0.9  # a GPU with < 90% free before the model loads holds someone else's memory


class _Timer:
    """Device time where there is a device (CUDA events: the kernels, not the launch), else the
    host's perf_counter; both synchronize before reading."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))

    def __enter__(self) -> "_Timer":
        if self.cuda:
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1000
        else:
            self.seconds = time.perf_counter() - self.t0


def _matmul_check(device: torch.device) -> tuple[bool, str, float]:
    """A matmul on the device against a float64 reference on the host; one warm-up call first
    (cuBLAS handle and kernel selection would otherwise be timed), then the median of 3 timed."""
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen, dtype=torch.float64)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=gen, dtype=torch.float64)
    reference = a @ b
    da, db = a.float().to(device), b.float().to(device)
    got = da @ db  # warm-up
    times = []
    for _ in range(3):
        with _Timer(device) as t:
            got = da @ db
        times.append(t.seconds)
    err = ((got.double().cpu() - reference).abs().max() / reference.abs().max()).item()
    return (
        err < MATMUL_TOL,
        f"matmul relative error {err:.2e} (limit {MATMUL_TOL:g})",
        statistics.median(times),
    )


def _allreduce(
    device: torch.device, group: Optional[dist.ProcessGroup] = None
) -> tuple[float, float]:
    """Seconds and bus GB/s of an all-reduce, warmed up, every rank started together (barrier
    first: a late rank would be timed as a slow link), completion waited for (synchronize)."""
    world = dist.get_world_size(group)
    size = ALLREDUCE_BYTES if device.type == "cuda" else CPU_ALLREDUCE_BYTES
    buf = torch.ones(size // 4, device=device)
    dist.all_reduce(buf, group=group)  # warm-up: NCCL builds its rings/trees on the first call
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    with _Timer(device) as t:
        dist.all_reduce(buf, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    busbw = size * 2 * (world - 1) / max(world, 1) / t.seconds / 1e9 if t.seconds > 0 else 0.0
    return t.seconds, busbw


def _in_group(device: torch.device, ranks: list[int]) -> float:
    """Bus GB/s of an all-reduce among `ranks`, called by those ranks only (a group of their own,
    made without the rest of the world: O(1) groups per rank at any scale)."""
    group = dist.new_group(ranks, use_local_synchronization=True)
    try:
        return _allreduce(device, group)[1]
    finally:
        dist.destroy_process_group(group)


def _pair_rounds(leads: list[int]) -> list[list[tuple[int, int]]]:
    """Node pairs by their lowest ranks: (0,1), (2,3), ...; with an odd count, the last node and
    the first in a second round."""
    rounds = [[(leads[i], leads[i + 1]) for i in range(0, len(leads) - 1, 2)]]
    if len(leads) % 2 and len(leads) > 1:
        rounds.append([(leads[-1], leads[0])])
    return rounds


def _node_names(node: str) -> list[str]:
    """Every rank's node name, by rank."""
    nodes: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    return nodes


def _fabric_checks(mine: RankHealth, device: torch.device, nodes: list[str]) -> None:
    """Within the node, then between node pairs (one rank a node), one after the other so that
    neither is timed beside the other's traffic."""
    here = [r for r, n in enumerate(nodes) if n == mine.node]
    if len(here) > 1:
        mine.intra_gbps = _in_group(device, here)
    dist.barrier()
    first: dict[str, int] = {}
    for r, n in enumerate(nodes):
        first.setdefault(n, r)
    leads = list(first.values())
    for pairs in _pair_rounds(leads):
        for a, b in pairs:
            if mine.rank in (a, b):
                partner = nodes[b if mine.rank == a else a]
                mine.pair_gbps[partner] = _in_group(device, [a, b])
        dist.barrier()


def free_memory_gib(device: torch.device) -> tuple[float, float]:
    """(free, total) GiB on the device, from the driver (other processes' memory counts)."""
    free, total = torch.cuda.mem_get_info(device)
    return free / 2**30, total / 2**30


@dataclass(frozen=True)
class NodeChecks:
    """What a node's lowest rank checks besides its devices: the run's mounts against the plan's
    per-node IO rates, and NVML on NVIDIA nodes; `read_only`: injected `bad_storage_node`."""

    mounts: tuple[tuple[str, Path], ...]
    plan: storage_probe.Rates = storage_probe.Rates()
    read_only: bool = False
    nvidia: bool = False

    def run(self, node: str) -> tuple[bool, str]:
        """(ok, the failure's reason); one line of figures to the rank's log either way."""
        if self.read_only:
            mounts = storage_probe.probe_read_only_mount(self.mounts, self.plan)
        else:
            mounts = storage_probe.probe_mounts(self.mounts, self.plan)
        gpus = gpu_health.check() if self.nvidia else None
        why = storage_probe.failure(mounts) or (gpus.reason if gpus and not gpus.ok else "")
        seen = "; ".join(
            f"{m.label}: " + ", ".join(f"{s.name} {s.detail}" for s in m.steps) for m in mounts
        )
        gpu_note = f"; gpu: {gpus.note}" if gpus else ""
        print(f"slurmtrain: node {node} checks: {seen}{gpu_note}", file=sys.stderr, flush=True)
        return not why, why


def node_checks(run_path: Path, cfg: RootConfig, read_only: bool) -> NodeChecks:
    """The checks of a run: its directory and its checkpoints (checkpoint.dir's, through the
    link), judged against `faults.io_write_mb_per_s` / `io_read_mb_per_s` on a cluster. A local
    run's one machine is never judged by rates: those are a cluster filesystem's, and failing the
    only machine there is cannot make the run go faster (errors still fail)."""
    mounts = (("run dir", run_path), ("checkpoint dir", (run_path / "checkpoints").resolve()))
    f, judged = cfg.faults, cfg.cluster.kind != "local"
    plan = storage_probe.Rates(
        (f.io_write_mb_per_s or None) if judged else None,
        (f.io_read_mb_per_s or None) if judged else None,
    )
    return NodeChecks(mounts, plan, read_only, nvidia=cfg.gpus_per_node > 0)


def _lead_checks(
    checks: Optional[NodeChecks], node: str, rank: int, nodes: list[str]
) -> tuple[bool, str, float]:
    """The node checks on the node's lowest rank only (O(nodes) file operations at any scale)."""
    if checks is None or nodes.index(node) != rank:
        return True, "", 0.0
    t0 = time.perf_counter()
    ok, why = checks.run(node)
    return ok, why, time.perf_counter() - t0


def check_rank(
    node: str,
    rank: int,
    device: torch.device,
    gpus_per_node: int,
    injected_bad: bool,
    checks: Optional[NodeChecks] = None,
) -> RankHealth:
    """This rank's checks (the node's, on its lowest rank). Every rank reaches the all-reduce,
    even a failing one (its peers would otherwise wait in it until the collective timeout)."""
    nodes = _node_names(node)
    node_ok, node_reason, node_s = _lead_checks(checks, node, rank, nodes)
    ok, reason, free = True, "", -1.0
    if gpus_per_node > 0 and torch.cuda.device_count() < 1:
        ok, reason = False, "no CUDA device visible"
        device = torch.device("cpu")
    seconds = 0.0
    if ok:
        ok, reason, seconds = _matmul_check(device)
    if ok and device.type == "cuda":
        free, total = free_memory_gib(device)
        if free < MIN_FREE_FRACTION * total:
            ok, reason = (
                False,
                (
                    f"only {free:.1f} of {total:.1f} GiB free before loading "
                    f"(another process holds GPU memory)"
                ),
            )
    if ok and not node_ok:  # the devices' own failure first: a slow shared mount may be let off
        ok, reason = False, node_reason
    if injected_bad:
        ok, reason = False, "injected failure (SLURMTRAIN_INJECT bad_node)"
    mine = RankHealth(node, rank, ok, "" if ok else reason, seconds, 0.0, node_check_s=node_s)
    mine.intra, mine.inter = fabric.intra_node(device), fabric.inter_node(device, os.environ)
    _fabric_checks(mine, device, nodes)
    mine.allreduce_s, mine.allreduce_gbps = _allreduce(device)
    mine.free_gib = free
    return mine


def gate(mine: RankHealth, world: int, slow_factor: float) -> Verdict:
    """Gather every rank's result; judge them (`judge`)."""
    everyone = [mine] * world  # each entry replaced by that rank's
    dist.all_gather_object(everyone, mine)
    return judge(everyone, slow_factor)


def _slow_everywhere(everyone: list[RankHealth]) -> set[str]:
    """Storage rates below the plan on every node of a multi-node job: the shared filesystem (or
    the plan's rates) is slow, no node is to blame, so none is failed for it (said in the log)."""
    slow = {h.node: h.reason for h in everyone if storage_probe.SLOW_MARK in h.reason}
    if len(slow) < 2 or len(slow) < len({h.node for h in everyone}):
        return set()
    why = next(iter(slow.values()))
    print(f"slurmtrain: every node's storage is slow, none blamed: {why}", file=sys.stderr)
    return set(slow.values())


def judge(everyone: list[RankHealth], slow_factor: float) -> Verdict:
    """The nodes that fail, are `slow_factor` x the median matmul, or whose links are below their
    fabric's floor (a node pair fails when every pair it was timed in is slow); the figures."""
    median = statistics.median(h.matmul_s for h in everyone)
    bad: dict[str, BadNode] = {}

    def fail(h: RankHealth, reason: str) -> None:
        bad.setdefault(h.node, {"node": h.node, "rank": h.rank, "reason": reason})

    shared = _slow_everywhere(everyone)
    for h in everyone:
        if not h.ok and h.reason not in shared:
            fail(h, h.reason)
        elif median > 0 and h.matmul_s > slow_factor * median:
            fail(h, f"slow: matmul {h.matmul_s / median:.1f}x median")
        elif fabric.below(h.intra_gbps, h.intra):
            fail(h, fabric.why_slow(h.intra_gbps, h.intra, "intra-node fabric"))
        elif h.pair_gbps and all(fabric.below(g, h.inter) for g in h.pair_gbps.values()):
            partner, gbps = min(h.pair_gbps.items(), key=lambda kv: kv[1])
            fail(h, fabric.why_slow(gbps, h.inter, f"link to node {partner}"))
    intra = [h.intra_gbps for h in everyone if h.intra_gbps > 0]
    pairs = [g for h in everyone for g in h.pair_gbps.values()]
    figures: Figures = {
        "allreduce_gbps": round(everyone[0].allreduce_gbps, 2),
        "fabric": f"{everyone[0].intra.name} / {everyone[0].inter.name}",
    }
    if intra:
        figures["intra_node_gbps"] = round(min(intra), 2)
    if pairs:
        figures["inter_node_gbps"] = round(min(pairs), 2)
    node_s = max(h.node_check_s for h in everyone)
    if node_s > 0:
        figures["node_checks_s"] = round(node_s, 3)
    return Verdict(list(bad.values()), figures)
