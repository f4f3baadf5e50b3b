"""One GPU, one sitting (under 8 minutes of an H200): what a 64-node run's numbers rest on.

    python bench/gpu_check.py --out FILE.jsonl          # a CUDA GPU (bench/gpu_check.sh sets it up)
    python bench/gpu_check.py --cpu --out FILE.jsonl    # the same script on this machine's CPU

Each measurement is one JSON line, printed and appended to --out (fsynced) the moment it is made, so
a run cut short by its time limit still leaves everything it measured:
- `gemm`: achievable bf16 matmul TFLOP/s (the MFU denominator's reality check);
- `throughput`: opt1.3b and opt2.7b (seq 2048, ZeRO-2, bf16) tokens/s, TFLOP/s and MFU of the real
  entrypoint beside a bare HF + DeepSpeed loop on the same shapes and batches (bench/gpu_throughput.py);
- `slice13b`: 4 layers with opt13b's shapes: the in-layer MFU ceiling of the headline model;
- `checkpoint_io`: save GB/s (its `checkpoint_saved`) and load GB/s with the page cache dropped;
- `bf16_vs_fp32`: losses of 20 steps, dropout off, both precisions;
- `resume`: a run paused and resumed against an uninterrupted one, judged against the run-to-run
  noise of two uninterrupted runs (flash attention's backward is not bitwise deterministic);
- `binding`: a task bound to one GPU (local id 1, CUDA_VISIBLE_DEVICES of one device) goes through
  slurmtrain's placement and DeepSpeed's own init_distributed/set_device and computes.
Every run passes `checkpoint.final_save=false` or saves once: the disk (64 GB) stays free.
Exit 0 when every check ran and passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from slurmtrain.common.events import Rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

GPU: dict[str, Any] = {
    "gemm": (8192, "bfloat16"),
    "throughput": {"opt1.3b": 8, "opt2.7b": 4},  # model -> micro batch at seq 2048
    "slice": ("opt13b", 2, 4),  # model, micro batch, layers
    "base": ["gpus_per_node=1", "data=synthetic", "deepspeed=zero2", "deepspeed.dtype=bf16"],
    "seq": 2048,
    "small": ("opt125m", 8),  # checkpoint, precision and resume runs
    "warmup": 10,
    "steps": 20,
}
CPU: dict[str, Any] = {
    "gemm": (512, "float32"),
    "throughput": {"opt_tiny": 4},
    "slice": ("opt_tiny", 4, 1),
    "base": [
        "gpus_per_node=0",
        "cluster.cpu_tasks_per_node=1",
        "data=synthetic",
        "deepspeed=zero2",
    ],
    "seq": 128,
    "small": ("opt_tiny", 4),
    "warmup": 3,
    "steps": 4,
}


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
        if fields.get("ok") is False:
            self.failed.append(check)
        return row


def slurmtrain(args: list[str], work: Path, timeout: float = 420, pausing: bool = False) -> Path:
    """`python -m slurmtrain cluster=local ...` on this machine: the run directory it trained."""
    name = next(a.split("=", 1)[1] for a in args if a.startswith("name="))
    cmd = [sys.executable, "-m", "slurmtrain", "cluster=local", f"runs_root={work}", *args]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout)
    found = sorted(work.glob(f"{name}/*/config.yaml"), key=os.path.getmtime)
    run = found[-1].parent if found else None
    if run is None or (done.returncode and not (pausing and run_events(run, "paused"))):
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
    return run


def run_events(run: Path, kind: str) -> Rows:
    from slurmtrain.common.rundir import RunDir

    return RunDir(run).events(kind)


def losses(run: Path) -> dict[int, float]:
    from slurmtrain.common import events
    from slurmtrain.common.jsonl import read_jsonl

    return {
        step: events.number(r, "loss")
        for r in read_jsonl(run / "metrics.jsonl")
        if "loss" in r and (step := events.integer(r, "step")) is not None
    }


def gemm(p: dict[str, Any], out: Out) -> None:
    import torch

    n, dtype_name = p["gemm"]
    dtype = getattr(torch, dtype_name)
    device = "cuda" if p is GPU else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    reps, t0 = 20, time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    seconds = time.perf_counter() - t0
    out.emit("gemm", n=n, dtype=dtype_name, tflops=2 * n**3 * reps / seconds / 1e12, ok=True)


def run_args(p: dict[str, Any], model: str, micro: int, steps: int, name: str) -> list[str]:
    return [
        *p["base"],
        f"model={model}",
        f"data.seq_len={p['seq']}",
        f"train.micro_batch_size={micro}",
        f"train.global_batch_size={micro}",
        f"train.max_steps={steps}",
        "train.log_interval=1",
        "model.dropout=0",
        "checkpoint.interval_steps=0",
        "checkpoint.final_save=false",
        f"name={name}",
    ]


def rate(run: Path, first: int, last: int, micro: int, seq: int) -> dict[str, Any]:
    from slurmtrain.common import events
    from slurmtrain.common.jsonl import read_jsonl

    rows = {
        step: r
        for r in read_jsonl(run / "metrics.jsonl")
        if (step := events.integer(r, "step")) is not None
    }
    seconds = events.number(rows[last], "time") - events.number(rows[first], "time")
    tps = (last - first) * micro * seq / seconds
    return {
        "tokens_per_s": tps,
        "mfu": rows[last].get("mfu"),
        "tflops": rows[last].get("tflops_per_gpu"),
    }


def throughput(p: dict[str, Any], out: Out, work: Path) -> None:
    from gpu_throughput import run_bare

    total = p["warmup"] + p["steps"]
    for model, micro in p["throughput"].items():
        name = f"tp-{model.replace('.', '_')}"
        run = slurmtrain(run_args(p, model, micro, total, name), work)
        ours = rate(run, p["warmup"], total, micro, p["seq"])
        bare = run_bare(run, p["warmup"], time.monotonic() + 400, model)
        ratio = ours["tokens_per_s"] / bare["tokens_per_s"] if bare.get("tokens_per_s") else None
        out.emit(
            "throughput",
            model=model,
            micro=micro,
            seq=p["seq"],
            ours=ours,
            bare=bare,
            ours_over_bare=ratio,
            ok=True,
        )


def slice13b(p: dict[str, Any], out: Out, work: Path) -> None:
    model, micro, layers = p["slice"]
    total = p["warmup"] + p["steps"]
    args = [*run_args(p, model, micro, total, "slice"), f"model.num_layers={layers}"]
    run = slurmtrain(args, work)
    out.emit(
        "slice13b",
        model=model,
        layers=layers,
        **rate(run, p["warmup"], total, micro, p["seq"]),
        ok=True,
    )


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


def resume_and_io(p: dict[str, Any], out: Out, work: Path) -> None:
    model, micro = p["small"]
    n = p["steps"] // 2 or 1
    base = run_args(p, model, micro, 2 * n, "x")[:-1]
    whole = [losses(slurmtrain([*base, f"name=whole{i}"], work)) for i in (1, 2)]
    cut = [*base, "checkpoint.final_save=true", f"train.pause_at_step={n}", "name=cut"]
    run = slurmtrain(cut, work, pausing=True)
    from slurmtrain.common import events

    [saved] = run_events(run, "checkpoint_saved")[-1:] or [{}]
    drop_cache(run / "checkpoints")
    slurmtrain(cut, work)
    [loaded] = run_events(run, "checkpoint_loaded")[-1:] or [{}]
    save_seconds = max(events.number(saved, "seconds"), 1e-9)
    save_gbs = events.number(saved, "bytes") / save_seconds / 1e9
    load_bytes = events.number(loaded, "rank_bytes") * (events.integer(loaded, "world_size") or 1)
    load_gbs = load_bytes / max(events.number(loaded, "seconds"), 1e-9) / 1e9
    out.emit(
        "checkpoint_io",
        bytes=saved.get("bytes"),
        save_gb_s=save_gbs,
        load_gb_s=load_gbs,
        ok=bool(saved) and bool(loaded),
    )
    resumed = losses(run)
    steps = range(n + 1, 2 * n + 1)
    noise = max(abs(whole[0][s] - whole[1][s]) for s in steps)
    diff = max(abs(whole[0][s] - resumed[s]) for s in steps)
    # Equal within what two identical runs differ by (x2, plus float64 round-off of logged losses).
    ok = diff <= 2 * noise + 1e-6 and loaded.get("step") == n
    out.emit(
        "resume",
        paused_at=n,
        resumed_from=loaded.get("step"),
        max_abs_diff=diff,
        run_to_run_noise=noise,
        ok=ok,
    )


def precision(p: dict[str, Any], out: Out, work: Path) -> None:
    model, micro = p["small"]
    steps = 20 if p is GPU else 6
    base = run_args(p, model, micro, steps, "x")[:-1]
    bf16 = losses(slurmtrain([*base, "deepspeed.dtype=bf16", "name=bf16"], work))
    fp32 = losses(slurmtrain([*base, "deepspeed.dtype=fp32", "name=fp32"], work))
    rel = max(abs(bf16[s] - fp32[s]) / abs(fp32[s]) for s in fp32)
    out.emit(
        "bf16_vs_fp32",
        steps=steps,
        final_bf16=bf16[steps],
        final_fp32=fp32[steps],
        max_rel_diff=rel,
        ok=rel < 0.05,
    )


_BINDING = r"""
import json, os, sys
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
x = torch.randn(256, 256, device=acc.current_device_name() if gpu else "cpu")
print(json.dumps({"slurm_localid": os.environ["SLURM_LOCALID"],
                  "local_rank": os.environ["LOCAL_RANK"], "device": str(device),
                  "accelerator_device": acc.current_device_name(),
                  "computed": bool(torch.isfinite((x @ x).sum()))}))
"""


def binding(p: dict[str, Any], out: Out, work: Path) -> None:
    from slurmtrain.login.local_submit import free_port

    # srun gave this task (local id 1 of 2 on the node) one GPU: it sees exactly one device.
    env = dict(
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
    if p is CPU:
        env["SLURMTRAIN_VISIBLE_DEVICES"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", _BINDING],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    seen = json.loads(lines[-1]) if lines else {"error": done.stderr[-1500:]}
    ok = done.returncode == 0 and seen.get("local_rank") == "0" and seen.get("computed") is True
    out.emit("binding", **seen, ok=ok)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="this machine's CPU, opt_tiny shapes")
    parser.add_argument("--out", default=None, help="append the JSON lines here too")
    parser.add_argument("--only", default="", help="comma-separated checks (default: all)")
    args = parser.parse_args()
    p = CPU if args.cpu else GPU
    out = Out(args.out)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("bench/gpu_check.py: no CUDA GPU visible; use --cpu here", file=sys.stderr)
            return 2
        out.emit("device", name=torch.cuda.get_device_name(0), torch=torch.__version__)
    checks: dict[str, Callable[..., None]] = {
        "binding": lambda w: binding(p, out, w),
        "gemm": lambda w: gemm(p, out),
        "throughput": lambda w: throughput(p, out, w),
        "slice13b": lambda w: slice13b(p, out, w),
        "resume": lambda w: resume_and_io(p, out, w),
        "precision": lambda w: precision(p, out, w),
    }
    chosen = [c for c in args.only.split(",") if c] or list(checks)
    t0 = time.monotonic()
    for name in chosen:
        with tempfile.TemporaryDirectory(prefix=f"gpu_check.{name}.") as tmp:
            try:
                checks[name](Path(tmp))
            except Exception as e:  # one check failing still runs the others
                out.emit(name, error=f"{type(e).__name__}: {str(e)[-2000:]}", ok=False)
    out.emit("done", seconds=round(time.monotonic() - t0, 1), failed=out.failed, ok=not out.failed)
    return 1 if out.failed else 0


if __name__ == "__main__":
    sys.exit(main())
