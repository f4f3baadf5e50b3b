"""The health gate: a quick check of every node before the model is loaded.

A node with a broken GPU, wrong arithmetic or a slow link costs a whole job; finding it takes
seconds here. Each rank checks its devices, a matmul against a float64 reference, and times an
all-reduce; results are gathered, and a failing or much slower node goes to the run's bad-node
ledger (`bad_nodes.jsonl`) so the next attempt excludes it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

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


def _matmul_check(device: torch.device) -> tuple[bool, str, float]:
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(256, 256, generator=gen, dtype=torch.float64)
    b = torch.randn(256, 256, generator=gen, dtype=torch.float64)
    reference = a @ b
    t0 = time.perf_counter()
    for _ in range(3):
        got = (a.float().to(device) @ b.float().to(device)).double().cpu()
    seconds = (time.perf_counter() - t0) / 3
    err = ((got - reference).abs().max() / reference.abs().max()).item()
    return err < 1e-4, f"matmul relative error {err:.2e}", seconds


def check_rank(node: str, rank: int, device: torch.device, gpus_per_node: int,
               injected_bad: bool) -> RankHealth:
    if gpus_per_node > 0 and torch.cuda.device_count() < 1:
        return RankHealth(node, rank, False, "no CUDA device visible", 0.0, 0.0)
    ok, reason, seconds = _matmul_check(device)
    if injected_bad:
        ok, reason = False, "injected failure (SLURMTRAIN_INJECT bad_node)"
    buf = torch.ones(1 << 20, device=device)  # 4 MiB
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    allreduce = time.perf_counter() - t0
    return RankHealth(node, rank, ok, "" if ok else reason, seconds, allreduce)


def gate(mine: RankHealth, world: int, slow_factor: float) -> list[dict[str, Any]]:
    """Gather every rank's result; the nodes that fail (or are `slow_factor` x the median)."""
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    median = statistics.median(h.matmul_s for h in everyone)
    bad: dict[str, dict[str, Any]] = {}
    for h in everyone:
        if not h.ok:
            bad.setdefault(h.node, {"node": h.node, "rank": h.rank, "reason": h.reason})
        elif median > 0 and h.matmul_s > slow_factor * median:
            bad.setdefault(h.node, {"node": h.node, "rank": h.rank,
                                    "reason": f"slow: matmul {h.matmul_s / median:.1f}x median"})
    return list(bad.values())
