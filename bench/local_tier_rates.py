"""Measured rates of the node-local checkpoint tier's IO, for the goodput simulator and the planner.

    python bench/local_tier_rates.py [--mb-per-rank 256] [--ranks 2] [--local /dev/shm]
        [--shared DIR] [--rounds 3] [--out bench/results/local_tier_rates.txt]

Each figure is bytes over seconds, so tools/goodput_sim.py and planning/local_tier_plan.py scale it
to a plan's bytes per node (never a tiny model's seconds). `--ranks` processes act as one node's
ranks, each with `--mb-per-rank` MB of fp32 tensors, started together after a pause (this VM's
balloon driver: see bench/checkpoint_io.py's dd_mb_s):
- local write: torch.save into `--local`, CRC-32 of the file, fsync (what a local save does)
- buddy copy: two processes as two node leads, gloo on loopback, compute/checkpoint/buddy.py's
  ring (read_tree -> send/recv -> write_tree with fsync and rename): the node's bytes per second
- local read: torch.load + CRC-32 from `--local` (a restart from the own copy)
- shared read: the same files written to `--shared` (default: this checkout's disk, where
  bench/checkpoint_io.py measured the shared tier's writes), evicted from the page cache
  (posix_fadvise DONTNEED after fsync), then torch.load + CRC-32 (a cold restart from the shared tier)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAUSE_S = 5.0  # longer than the balloon driver's free page reporting delay (2 s)


def _tensors(mb: int) -> dict[str, object]:
    import torch

    n = mb * 2**20 // 4 // 8
    return {f"t{i}": torch.full((n,), float(i)) for i in range(8)}


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _write(rank: int, mb: int, directory: str, start: Any, q: Any) -> None:
    import torch

    state, path = _tensors(mb), Path(directory) / f"rank{rank}.pt"
    time.sleep(PAUSE_S)
    start.wait()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    _crc(path)
    q.put(time.perf_counter() - t0)


def _read(rank: int, directory: str, start: Any, q: Any) -> None:
    import torch

    path = Path(directory) / f"rank{rank}.pt"
    start.wait()
    t0 = time.perf_counter()
    _crc(path)
    torch.load(path, weights_only=True)
    q.put(time.perf_counter() - t0)


def _buddy(node: int, src: str, dst: str, port: int, start: Any, q: Any) -> None:
    import torch.distributed as dist

    from slurmtrain.compute.checkpoint import buddy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=node, world_size=2)
    files = buddy.read_tree(Path(src), [f"rank{node}.pt"])
    time.sleep(PAUSE_S)
    start.wait()
    t0 = time.perf_counter()
    got = buddy.ring(node, 2, [0, 1], files)
    assert isinstance(got, dict)
    buddy.write_tree(got, Path(dst) / f"held{node}")
    q.put(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()


def _gang(target: Callable[..., None], args: tuple[object, ...], n: int) -> float:
    """Run `n` processes of `target(i, *args, barrier, queue)` at once; the slowest one's seconds."""
    ctx = mp.get_context("spawn")
    q, start = ctx.Queue(), ctx.Barrier(n)
    procs = [ctx.Process(target=target, args=(i, *args, start, q)) for i in range(n)]
    for p in procs:
        p.start()
    seconds = [float(q.get(timeout=600)) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"bench process failed: exit {p.exitcode}")
    return max(seconds)


def _evict(directory: Path) -> None:
    for path in directory.glob("*.pt"):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def measure(mb: int, ranks: int, local: Path, shared: Path) -> dict[str, float]:
    """MB/s of each phase for one node's bytes (`ranks` x `mb`; the buddy copy: one rank's)."""
    node_mb = mb * ranks * 2**20 / 1e6
    out = {"local_write": node_mb / _gang(_write, (mb, str(local)), ranks)}
    out["local_read"] = node_mb / _gang(_read, (str(local),), ranks)
    port = 29500 + os.getpid() % 1000
    out["buddy_copy"] = mb * 2**20 / 1e6 / _gang(_buddy, (str(local), str(local), port), 2)
    _gang(_write, (mb, str(shared)), ranks)
    _evict(shared)
    time.sleep(PAUSE_S)
    out["shared_read"] = node_mb / _gang(_read, (str(shared),), ranks)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb-per-rank", type=int, default=256)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--local", type=Path, default=Path("/dev/shm"))
    p.add_argument("--shared", type=Path, default=ROOT / "runs")
    p.add_argument("--rounds", type=int, default=3, help="the best round's rate is printed")
    p.add_argument("--out", type=Path, default=None, help="also write the figures to this file")
    a = p.parse_args()
    a.shared.mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix="local-tier-rates-", dir=a.local))
    shared = Path(tempfile.mkdtemp(prefix="local-tier-rates-", dir=a.shared))
    try:
        rounds = [measure(a.mb_per_rank, a.ranks, local, shared) for _ in range(a.rounds)]
    finally:
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
    lines = [
        f"# python bench/local_tier_rates.py --mb-per-rank {a.mb_per_rank} --ranks {a.ranks} "
        f"--local {a.local} --shared {a.shared}  ({time.strftime('%Y-%m-%d', time.gmtime())}, "
        f"{os.cpu_count()}-core VM; loopback gloo, not a fabric)",
        f"# one node = {a.ranks} ranks x {a.mb_per_rank} MB; MB/s = the node's bytes / the slowest "
        "rank's seconds (buddy copy: one node lead's bytes)",
        f"# best of {a.rounds} rounds (others share this machine: its load slows, never speeds, "
        "a round); every round: "
        + "; ".join(f"{k} {[round(r[k]) for r in rounds]}" for k in rounds[0]),
        *(f"{k} MB/s: {max(r[k] for r in rounds):.1f}" for k in rounds[0]),
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
