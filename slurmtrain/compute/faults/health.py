"""The health gate: a quick check of every node before the model is loaded.

A node with a broken GPU, wrong arithmetic or a slow link costs a whole job. Each rank checks its
devices, a matmul against a float64 reference, free device memory, and times an all-reduce; a
failing or much slower node goes to the run's bad-node ledger so the next attempt excludes it.
Healthy nodes must pass: timed calls are warmed up, timed with device events after a synchronize,
the all-reduce starts after a barrier, and the matmul tolerance admits TF32.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TypedDict

import torch
import torch.distributed as dist


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


def _allreduce(device: torch.device, world: int) -> tuple[float, float]:
    """Seconds and bus GB/s of an all-reduce, warmed up, every rank started together (barrier
    first: a late rank would be timed as a slow link), completion waited for (synchronize)."""
    size = ALLREDUCE_BYTES if device.type == "cuda" else CPU_ALLREDUCE_BYTES
    buf = torch.ones(size // 4, device=device)
    dist.all_reduce(buf)  # warm-up: NCCL builds its rings/trees on the first call
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    with _Timer(device) as t:
        dist.all_reduce(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    busbw = size * 2 * (world - 1) / max(world, 1) / t.seconds / 1e9 if t.seconds > 0 else 0.0
    return t.seconds, busbw


def free_memory_gib(device: torch.device) -> tuple[float, float]:
    """(free, total) GiB on the device, from the driver (other processes' memory counts)."""
    free, total = torch.cuda.mem_get_info(device)
    return free / 2**30, total / 2**30


def check_rank(
    node: str, rank: int, device: torch.device, gpus_per_node: int, injected_bad: bool
) -> RankHealth:
    """This rank's checks. Every rank reaches the all-reduce, even a failing one (its peers would
    otherwise wait in it until the collective timeout)."""
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
    if injected_bad:
        ok, reason = False, "injected failure (SLURMTRAIN_INJECT bad_node)"
    allreduce, gbps = _allreduce(device, dist.get_world_size())
    return RankHealth(node, rank, ok, "" if ok else reason, seconds, allreduce, gbps, free)


def gate(mine: RankHealth, world: int, slow_factor: float) -> list[BadNode]:
    """Gather every rank's result; the nodes that fail (or are `slow_factor` x the median)."""
    everyone = [mine] * world  # each entry replaced by that rank's
    dist.all_gather_object(everyone, mine)
    median = statistics.median(h.matmul_s for h in everyone)
    bad: dict[str, BadNode] = {}
    for h in everyone:
        if not h.ok:
            bad.setdefault(h.node, {"node": h.node, "rank": h.rank, "reason": h.reason})
        elif median > 0 and h.matmul_s > slow_factor * median:
            bad.setdefault(
                h.node,
                {
                    "node": h.node,
                    "rank": h.rank,
                    "reason": f"slow: matmul {h.matmul_s / median:.1f}x median",
                },
            )
    return list(bad.values())
