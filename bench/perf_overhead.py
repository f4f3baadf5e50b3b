"""What each per-step addition of slurmtrain's loop costs, measured A/B in one process.

    python bench/perf_overhead.py [--blocks 12] [--block-steps 20] [--ranks 2]

On a shared machine a whole-run comparison (bench/loop_overhead.py) moves by tens of percent from
run to run; here the variants take turns in blocks of steps inside the same rank processes (gloo,
the tiny OPT), so the same noise hits all of them, and the median block time per step is compared:

- bare: DeepSpeed forward/backward/step + one all_reduce per step (bench/loop_twin.py)
- bare+timers: the same with DeepSpeed's wall_clock_breakdown timers (muted by perf.StepTimers)
- loop: slurmtrain's loop.train (metrics row + TensorBoard every log interval, perf tracking),
  with timers off and on, at log intervals 1 and 10
- straggler detection (faults.stragglers, on by default) A/B: the loop at log interval 10 with
  it off; the last line is its cost, the paired median of on/off over the blocks (issue 39: <= 1%)
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from slurmtrain.common.events import Row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PORT = 29733  # the ranks' rendezvous on this machine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each rank")
    args = parser.parse_args()
    if "RANK" not in os.environ:  # the launcher: one process per rank, rank 0 prints
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *sys.argv[1:]],
                env=dict(
                    os.environ,
                    RANK=str(r),
                    LOCAL_RANK=str(r),
                    WORLD_SIZE=str(args.ranks),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(PORT),
                    DS_ACCELERATOR="cpu",
                    PYTHONWARNINGS="ignore",
                    OMP_NUM_THREADS=str(args.threads),
                ),
            )
            for r in range(args.ranks)
        ]
        raise SystemExit(max(p.wait() for p in procs))
    rank_main(args)


def rank_main(args: argparse.Namespace) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from slurmtrain.common import ds_config, schema, validation
    from slurmtrain.common.derived import grad_accumulation
    from slurmtrain.compute import data, loop, model
    from slurmtrain.compute.context import RankContext
    from slurmtrain.compute.distributed import Placement
    from slurmtrain.compute.faults.signals import SignalFlags
    from slurmtrain.compute.faults.watchdog import Watchdog
    from slurmtrain.compute.observe.metrics import MetricsWriter
    from slurmtrain.compute.observe.perf import Perf, StepTimers

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        composed = compose(
            "config",
            overrides=[
                "cluster=local",  # resolved, as the launch flow hands the compute side
                "gpus_per_node=0",
                f"train.global_batch_size={4 * world}",
                "train.max_steps=100000",
                "checkpoint.interval_steps=0",
                "checkpoint.final_save=false",
                f"cluster.cpu_tasks_per_node={world}",
            ],
        )
    # The compute side's config: the schema's dataclass, as schema.load_run_config hands the loop.
    base = OmegaConf.to_object(composed)
    assert isinstance(base, schema.RootConfig)
    validation.validate_config(base, submitting=False)
    tokens = data.load_tokens(base.data.kind, None, base.data.max_corpus_bytes)
    sampler = data.Sampler(len(tokens), base.data.seq_len, base.data.seed)
    tmp = Path(tempfile.mkdtemp(prefix="perf_overhead_"))
    device = torch.device("cpu")
    # Built from the launcher's ranks, not distributed.placement(): inside a Slurm job that would
    # read the allocation's SLURM_PROCID instead.
    where = Placement(rank, rank, world, "127.0.0.1", PORT, None, "localhost")
    # Never started: the blocks have no deadlines to miss.
    watchdog = Watchdog(3600.0, tmp / f"stacks_{rank}.txt", lambda why: None, 1)
    ctx = RankContext(where, device, _no_ledger, watchdog)

    def engine(timers: bool) -> DeepSpeedEngine:
        cfg = copy.deepcopy(base)
        cfg.train.timers = timers
        ds = ds_config.build(cfg, world)
        net = model.build(cfg, ds)
        eng, *_ = deepspeed.initialize(
            model=net,
            model_parameters=net.parameters(),
            config=ds,
            lr_scheduler=ds_config.lr_scheduler(cfg),  # the schedule slurmtrain trains with
        )
        return eng

    engines = {False: engine(False), True: engine(True)}
    StepTimers(engines[True])  # mute DeepSpeed's per-step timer print for the bare+timers variant
    steps = {False: 0, True: 0}

    def bare(timers: bool) -> None:
        eng = engines[timers]
        for _ in range(args.block_steps):
            ids = sampler.indices(steps[timers], 0, rank, 4, world, 4 * world)
            loss = model.loss_fn(eng, torch.from_numpy(data.batch(tokens, ids, base.data.seq_len)))
            eng.backward(loss)
            eng.step()
            dist.all_reduce(loss.detach().reshape(1))
            steps[timers] += 1

    hooks: dict[tuple[bool, int, bool], loop.LoopHooks] = {}
    batches = loop.Batches(tokens, sampler, grad_accumulation(base, world))

    def ours(timers: bool, log_interval: int, stragglers: bool = True) -> None:
        cfg = copy.deepcopy(base)
        cfg.train.timers, cfg.train.log_interval = timers, log_interval
        cfg.faults.stragglers = stragglers
        cfg.train.max_steps = steps[timers] + args.block_steps
        key = (timers, log_interval, stragglers)
        if key not in hooks:
            run = tmp / f"t{int(timers)}_l{log_interval}_s{int(stragglers)}"
            run.mkdir()
            metrics = MetricsWriter(
                run / "metrics.jsonl", rank == 0, 1, run / "tb", print_lines=False
            )
            perf = Perf(engines[timers], cfg, ctx, run)
            hooks[key] = loop.LoopHooks(lambda step, loss: None, SignalFlags(), metrics, perf)
        state = loop.LoopState(steps[timers], steps[timers], time.time())
        loop.train(engines[timers], cfg, batches, state, ctx, hooks[key])
        steps[timers] = state.step

    variants: dict[str, Callable[[], None]] = {
        "bare": lambda: bare(False),
        "bare+timers": lambda: bare(True),
        "loop timers=off log=10": lambda: ours(False, 10),
        "loop timers=on log=10": lambda: ours(True, 10),
        "loop timers=off log=1": lambda: ours(False, 1),
        "loop timers=on log=1": lambda: ours(True, 1),
        "loop stragglers=off log=10": lambda: ours(False, 10, stragglers=False),
    }
    for run_variant in variants.values():  # warm-up: first steps allocate and JIT
        run_variant()
    per_step: dict[str, list[float]] = {name: [] for name in variants}
    cpu_per_step: dict[str, list[float]] = {name: [] for name in variants}
    for block in range(args.blocks):
        order = list(variants.items())
        order = order[block % len(order) :] + order[: block % len(order)]  # rotate the order
        for name, run_variant in order:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            run_variant()
            cpu = torch.tensor([time.process_time() - c0], dtype=torch.float64)
            dist.barrier()
            per_step[name].append((time.perf_counter() - t0) / args.block_steps)
            dist.all_reduce(cpu)  # CPU seconds of all ranks: less noisy than wall on a busy box
            cpu_per_step[name].append(cpu.item() / args.block_steps)
    if rank:
        return _teardown(engines)
    ref, cpu_ref = statistics.median(per_step["bare"]), statistics.median(cpu_per_step["bare"])
    print(
        f"{args.blocks} blocks x {args.block_steps} steps, tiny OPT, {world} CPU ranks x "
        f"{args.threads} thread(s); medians per step: wall (IQR) | CPU of all ranks (IQR)"
    )
    for name, values in per_step.items():
        med, cpu_med = statistics.median(values), statistics.median(cpu_per_step[name])
        # Paired: each block against the bare block of the same round (the load drifts slowly).
        paired = statistics.median(v / b for v, b in zip(values, per_step["bare"]))
        print(
            f"  {name:24s} {1e3 * med:7.2f} ms {100 * (med / ref - 1):+6.1f}% "
            f"({1e3 * _iqr(values):5.2f}) paired {100 * (paired - 1):+5.1f}% | "
            f"{1e3 * cpu_med:7.2f} ms {100 * (cpu_med / cpu_ref - 1):+6.1f}% "
            f"({1e3 * _iqr(cpu_per_step[name]):5.2f})"
        )
    on, off = "loop timers=off log=10", "loop stragglers=off log=10"
    for clock, table in (("wall", per_step), ("CPU", cpu_per_step)):
        cost = statistics.median(a / b for a, b in zip(table[on], table[off])) - 1
        print(
            f"straggler detection (faults.stragglers on vs off, log=10), {clock}: "
            f"{100 * cost:+.2f}% per step, paired median of {args.blocks} blocks (on "
            f"{1e3 * statistics.median(table[on]):.2f} ms, off {1e3 * statistics.median(table[off]):.2f} ms)"
        )
    clock_us = _section_clock_us()
    print(
        f"section clocks alone: {clock_us:.2f} us per micro step = "
        f"{100 * clock_us * 1e-6 / statistics.median(per_step[off]):.4f}% of the median step"
    )
    _teardown(engines)


def _section_clock_us(micro_steps: int = 20_000) -> float:
    """What the loop's section clocks cost per micro step (start and four laps), timed alone: the
    A/B above is within the noise of a shared machine, this is not."""
    import torch

    from slurmtrain.compute.observe import stragglers

    clock = stragglers.Sections(torch.device("cpu"))
    t0 = time.perf_counter()
    for _ in range(micro_steps):
        clock.start()
        for section in range(len(stragglers.SECTIONS)):
            clock.lap(section)
    clock.take()
    return (time.perf_counter() - t0) / micro_steps * 1e6


def _no_ledger(row: Row) -> None:
    """The bench writes no ledger: Perf's straggler and FLOPs rows go nowhere."""


def _teardown(engines: dict[bool, DeepSpeedEngine]) -> None:
    import torch.distributed as dist

    for eng in engines.values():
        eng.destroy()
    dist.destroy_process_group()


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


if __name__ == "__main__":
    main()
