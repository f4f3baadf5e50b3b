"""One GPU, one sitting (8 minutes of an H100): what a 64-node run's numbers rest on, judged.

    python bench/gpu_check.py --out FILE.jsonl          # a CUDA GPU (bench/gpu_check.sh sets it up)
    python bench/gpu_check.py --cpu --out FILE.jsonl    # the same script on this machine's CPU
    python bench/gpu_check.py --dry [--card-gib 79.1]   # the plan: every run, its timeout, the
                                                        # planner's verdict (80 and 141 GB cards)

The runs, their order and timeouts are bench/gpu_check_plan.py's; each is a process killed with its
whole group at its timeout, and on a GPU the timeouts add up to at most 450 s. Each measurement is
one JSON line, printed and appended to --out (fsynced) the moment it is made, most important first:
- `device`, `gemm`, `binding`: the card (name, memory from torch.cuda.mem_get_info: every later run
  is planned for it, cluster.gpu_mem_gb), a bf16 matmul's TFLOP/s, and a task bound to one GPU
  (local id 1, CUDA_VISIBLE_DEVICES of one device) through slurmtrain's placement and DeepSpeed;
- `n1`: an async save's fp32 partition against DeepSpeed's single_partition_of_fp32_groups at that
  step, byte for byte, while training went on (bench/gpu_n1.py);
- `throughput`: opt1.3b (seq 2048, ZeRO-2, bf16) tokens/s, TFLOP/s and MFU of the real entrypoint
  over its steady window (no evaluation in it) beside a really bare transformers + DeepSpeed loop
  (bench/gpu_throughput.py); judged: ours/bare >= 0.97, MFU >= the card's floor (the plan's table);
- `checkpoint_io`: save GB/s over the whole save (`total_seconds`: host copy, write, fsync,
  publish; not the seconds the loop was blocked) and load GB/s with the page cache dropped;
- `resume`: a run paused and resumed against an uninterrupted one, judged against the run-to-run
  noise of two uninterrupted runs (flash attention's backward is not bitwise deterministic);
- `bf16_vs_fp32`: the losses of the same steps in both precisions, dropout off;
- with --extras (a longer lease): opt2.7b throughput and a 4-layer opt13b slice's MFU.
Exit 0 when every check ran and passed, 1 otherwise; --dry exits 1 when a run is refused by the
planner or the timeouts exceed the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check_plan as plan  # noqa: E402  (bench/ is not a package)
from gpu_throughput import RunFailed, compare, run_slurmtrain, spawn  # noqa: E402

DRY_CARDS = (79.1, 139.8)  # GiB PyTorch reports for an H100 80GB and an H200 141GB


class Out:
    """JSON lines on stdout and in a file, each written through to disk as it is measured."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = Path(path) if path else None
        self.failed: list[str] = []

    def emit(self, check: str, **fields: Any) -> dict[str, Any]:
        row = {"check": check, "time": round(time.time(), 1), **fields}
        line = json.dumps(row, default=str)
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        if fields.get("ok") is not True:
            self.failed.append(check)
        return row


class Check:
    """The runs of one sitting against one deadline; `gib` is the card's memory once probed."""

    def __init__(self, mode: plan.Mode, out: Out, work: Path, runs: list[plan.Run]) -> None:
        self.mode, self.out, self.work = mode, out, work
        self.runs = {r.label: r for r in runs}
        self.deadline = time.monotonic() + mode.budget_s
        self.gib: Optional[float] = None
        self.device = "cpu"
        self.whole1: Optional[dict[int, float]] = None

    def run(self, label: str) -> plan.Run:
        """The run with the card's memory in its overrides."""
        return replace(
            self.runs[label], overrides=tuple(plan.with_card(self.runs[label].overrides, self.gib))
        )

    def timeout(self, run: plan.Run) -> float:
        left = self.deadline - time.monotonic()
        if left < 5:
            raise RunFailed(
                f"{run.label}: not started, the check's {self.mode.budget_s} s are spent"
            )
        return min(run.timeout_s, left)

    def slurmtrain(self, label: str, pausing: bool = False) -> Path:
        run = self.run(label)
        return run_slurmtrain(run.overrides, self.work, self.timeout(run), pausing)


_PROBE = r"""
import json, os, sys, time
from slurmtrain.compute.distributed import export, placement, rank_device
where = placement(os.environ)
export(where)  # what DeepSpeed reads: LOCAL_RANK must name the device this task sees
import deepspeed, torch
from deepspeed.accelerator import get_accelerator
gpu = torch.cuda.is_available()
if not gpu:  # as compute/attempt.py: the CPU shm comm op would JIT-build for ~25 s
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")
acc = get_accelerator()
acc.set_device(int(os.environ["LOCAL_RANK"]))
device = rank_device(1 if gpu else 0, os.environ, where.local_rank)
where_to = acc.current_device_name() if gpu else "cpu"
x = torch.randn(256, 256, device=where_to)
binding = {"slurm_localid": os.environ["SLURM_LOCALID"], "local_rank": os.environ["LOCAL_RANK"],
           "device": str(device), "accelerator_device": acc.current_device_name(),
           "computed": bool(torch.isfinite((x @ x).sum()))}
card = {"name": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__,
        "total_bytes": torch.cuda.mem_get_info()[1] if gpu else None}
n, dtype = int(sys.argv[1]), getattr(torch, sys.argv[2])
a, b = (torch.randn(n, n, device=where_to, dtype=dtype) for _ in range(2))
sync = torch.cuda.synchronize if gpu else (lambda: None)
for _ in range(3):
    a @ b
sync()
t0 = time.perf_counter()
for _ in range(20):
    a @ b
sync()
gemm = {"n": n, "dtype": sys.argv[2], "tflops": 2 * n**3 * 20 / (time.perf_counter() - t0) / 1e12}
print(json.dumps({"binding": binding, "card": card, "gemm": gemm}))
"""


def device(c: Check) -> None:
    """The card, a matmul and a task bound to one GPU: one process, the card's memory for the rest."""
    from slurmtrain.login.local_submit import free_port

    env = dict(  # srun gave this task (local id 1 of 2 on the node) one GPU: it sees exactly one
        os.environ,
        SLURM_PROCID="0",
        SLURM_NTASKS="1",
        SLURM_LOCALID="1",
        SLURM_NTASKS_PER_NODE="2",
        SLURM_JOB_ID="1",
        SLURM_NODELIST="localhost",
        SLURM_STEP_NODELIST="localhost",
        SLURMD_NODENAME="localhost",
        MASTER_PORT=str(free_port()),
        CUDA_VISIBLE_DEVICES="0",
    )
    if c.mode.name == "cpu":
        env["SLURMTRAIN_VISIBLE_DEVICES"] = "0"
    n, dtype = c.mode.gemm
    cmd = [sys.executable, "-c", _PROBE, str(n), dtype]
    done = spawn(cmd, c.timeout(c.runs["device"]), cwd=c.work, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise RunFailed(f"device probe: exit {done.returncode}: {done.stderr[-1500:]}")
    seen = json.loads(lines[-1])
    card, binding = seen["card"], seen["binding"]
    c.device = card["name"]
    if card["total_bytes"]:
        c.gib = plan.card_gib(card["total_bytes"])
    c.out.emit("device", **card, gpu_mem_gb=c.gib, ok=True)
    c.out.emit("gemm", **seen["gemm"], ok=seen["gemm"]["tflops"] > 0)
    ok = binding["local_rank"] == "0" and binding["computed"] is True
    c.out.emit("binding", **binding, ok=ok)


def n1(c: Check) -> None:
    run = c.run("n1")
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_n1.py"), str(c.mode.n1_save)]
    cmd += ["cluster=local", f"runs_root={c.work / 'n1'}", *run.overrides]
    done = spawn(cmd, c.timeout(run), cwd=c.work)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise RunFailed(f"n1: exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    c.out.emit("n1", **json.loads(lines[-1]))


def throughput(c: Check, extras: bool = False) -> None:
    labels = [r.label for r in c.runs.values() if r.check == "throughput" and r.kind != "bare"]
    models = {r.label: (r.model, r.micro) for r in c.runs.values()}
    chosen = labels[len(c.mode.throughput) :] if extras else labels[: len(c.mode.throughput)]
    for label in chosen:
        runs = [c.run(x) for x in (label, f"{label}-bare") if x in c.runs]
        try:
            row = compare(c.mode, runs, c.work, c.device, c.deadline, label.removeprefix("tp-"))
        except Exception as e:  # one model failing still runs the next
            model, micro = models[label]
            check = "slice13b" if label == "tp-slice13b" else "throughput"
            c.out.emit(check, model=model, micro=micro, error=_error(e), ok=False)
            continue
        c.out.emit("slice13b" if label == "tp-slice13b" else "throughput", **row)


def losses(run: Path) -> dict[int, float]:
    from metric_fields import integer, number

    from slurmtrain.common.jsonl import read_jsonl

    return {
        step: number(r, "loss")
        for r in read_jsonl(run / "metrics.jsonl")
        if "loss" in r and (step := integer(r, "step")) is not None
    }


def drop_cache(folder: Path) -> None:
    """Evict a folder's files from the page cache (posix_fadvise: works without root too)."""
    for f in folder.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def resume(c: Check) -> None:
    from slurmtrain.common import events
    from slurmtrain.common.rundir import RunDir

    n = c.mode.resume_n
    c.whole1 = losses(c.slurmtrain("resume-whole1"))
    run = c.slurmtrain("resume-cut", pausing=True)
    saves = [e for e in RunDir(run).events() if isinstance(e, events.CheckpointSaved)]
    drop_cache(run / "checkpoints")
    c.slurmtrain("resume-cont")
    loads = [e for e in RunDir(run).events() if isinstance(e, events.CheckpointLoaded)]
    saved = saves[-1] if saves else events.CheckpointSaved()
    loaded = loads[-1] if loads else events.CheckpointLoaded()
    # The whole save (host copy, write, fsync, publish), not the seconds the loop was blocked.
    whole_s = saved.total_seconds or saved.seconds or 0.0
    load_bytes = (loaded.rank_bytes or 0) * (loaded.world_size or 1)
    load_s = loaded.seconds or 0.0
    c.out.emit(
        "checkpoint_io",
        bytes=saved.bytes,
        mode=saved.mode,
        save_total_s=whole_s,
        save_blocked_s=saved.seconds,
        save_gb_s=(saved.bytes or 0) / whole_s / 1e9 if whole_s else None,
        load_gb_s=load_bytes / load_s / 1e9 if load_s else None,
        ok=bool(saves) and bool(loads) and bool(whole_s),
    )
    resumed = losses(run)
    whole2 = losses(c.slurmtrain("resume-whole2"))
    steps = range(n + 1, 2 * n + 1)
    noise = max(abs(c.whole1[s] - whole2[s]) for s in steps)
    diff = max(abs(c.whole1[s] - resumed[s]) for s in steps)
    # Equal within what two identical runs differ by (x2, plus float64 round-off of logged losses).
    ok = diff <= 2 * noise + 1e-6 and loaded.step == n
    c.out.emit(
        "resume",
        paused_at=n,
        resumed_from=loaded.step,
        max_abs_diff=diff,
        run_to_run_noise=noise,
        threshold="max_abs_diff <= 2 x run_to_run_noise + 1e-6",
        ok=ok,
    )


def precision(c: Check) -> None:
    bf16 = c.whole1 if c.whole1 is not None else losses(c.slurmtrain("resume-whole1"))
    fp32 = losses(c.slurmtrain("precision-fp32"))
    rel = max(abs(bf16[s] - fp32[s]) / abs(fp32[s]) for s in fp32)
    last = max(fp32)
    c.out.emit(
        "bf16_vs_fp32",
        steps=last,
        final_bf16=bf16[last],
        final_fp32=fp32[last],
        max_rel_diff=rel,
        threshold="max_rel_diff < 0.05",
        ok=rel < 0.05,
    )


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[-2000:]}"


def dry(mode: plan.Mode, cards: list[Optional[float]], extras: bool) -> int:
    """Every run the check would start, each asked of the planner for each card; the timeouts."""
    runs = plan.plan(mode, extras)
    total = sum(r.timeout_s for r in runs)
    refused = 0
    with tempfile.TemporaryDirectory(prefix="gpu_check.dry.") as tmp:
        for gib in cards:
            verdicts = plan.planner(runs, gib, tmp)
            print(f"{mode.name} plan, card {f'{gib:g} GiB' if gib else '(none)'}:")
            for i, run in enumerate(runs, 1):
                v = verdicts.get(run.label)
                said = "-" if v is None else v.text + (" (its twin's plan)" * (run.kind == "bare"))
                refused += v is not None and not v.fits
                print(f"{i:>3} {run.label:<16} {run.kind:<10} {run.timeout_s:>4} s  {said}")
                if run.overrides:
                    args = " ".join(plan.with_card(run.overrides, gib))
                    print(f"      {'bare loop, shapes of: ' if run.kind == 'bare' else ''}{args}")
    over = total > mode.budget_s
    print(
        f"{len(runs)} runs, timeouts sum {total} s (budget {mode.budget_s} s"
        f"{': OVER' if over else ''}); {refused} refused by the planner"
    )
    return 1 if refused or over else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="this machine's CPU, opt_tiny shapes")
    parser.add_argument("--out", default=None, help="append the JSON lines here too")
    parser.add_argument("--only", default="", help="comma-separated checks (default: all)")
    parser.add_argument("--extras", action="store_true", help="opt2.7b and the opt13b slice too")
    parser.add_argument("--dry", action="store_true", help="print the plan; start nothing")
    parser.add_argument("--card-gib", type=float, action="append", help="--dry: the card(s)")
    args = parser.parse_args()
    mode = plan.CPU if args.cpu else plan.GPU
    if args.dry:
        cards = args.card_gib or ([None] if args.cpu else list(DRY_CARDS))
        return dry(mode, cards, args.extras)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print(
                "bench/gpu_check.py: no CUDA GPU visible; use --cpu or --dry here", file=sys.stderr
            )
            return 2
    out = Out(args.out)
    checks: dict[str, Callable[[Check], None]] = {
        "device": device,
        "n1": n1,
        "throughput": throughput,
        "resume": resume,
        "precision": precision,
    }
    if args.extras:
        checks["extras"] = lambda c: throughput(c, extras=True)
    chosen = [x for x in args.only.split(",") if x] or list(checks)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
        check = Check(mode, out, Path(tmp), plan.plan(mode, args.extras))
        for name in chosen:
            try:
                checks[name](check)
            except Exception as e:  # one check failing still runs the others
                out.emit(name, error=_error(e), ok=False)
    out.emit("done", seconds=round(time.monotonic() - t0, 1), failed=out.failed, ok=not out.failed)
    return 1 if out.failed else 0


if __name__ == "__main__":
    sys.exit(main())
