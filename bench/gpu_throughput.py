"""GPU throughput: slurmtrain's real entrypoint vs a bare DeepSpeed loop, OPT-125m and OPT-1.3b.

    python bench/gpu_throughput.py [--models opt125m,opt1.3b] [--steps 30] [--warmup 10]
                                   [--micro-batch opt125m=8,opt1.3b=4] [--budget-s 290]

One GPU, bf16, seq 2048, ZeRO-2, synthetic data. Ours is `python -m slurmtrain model=M
gpus_per_node=1 ...` (local executor: one task), timed from metrics.jsonl between the rows of steps
WARMUP and WARMUP+STEPS; the bare loop builds the same model, DeepSpeed config and batches from the
same run directory and times the same steps with CUDA synchronised at both ends. Prints tokens/s,
TFLOPS and MFU (slurmtrain.planning.flops, model FLOPs) side by side and writes
bench/results/<date>-<device>.json. Without a CUDA GPU it stops at once (exit 2) saying so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
SEQ = 2048
LOG_INTERVAL = 5
DEFAULT_MICRO = {"opt125m": 8, "opt1.3b": 4}


def require_gpu() -> str:
    """The CUDA device name, or exit 2 with one line saying why there is none."""
    try:
        import torch
    except ImportError as e:
        raise SystemExit(
            f"bench/gpu_throughput.py: cannot import torch ({e}); run it in the "
            f"project's venv on a GPU machine"
        ) from e
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        smi = "nvidia-smi found" if shutil.which("nvidia-smi") else "no nvidia-smi"
        print(
            f"bench/gpu_throughput.py: no CUDA GPU visible (torch {torch.__version__}, "
            f"torch.cuda.is_available()={torch.cuda.is_available()}, {smi}); this benchmark "
            f"needs one GPU: run it on a GPU machine",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return str(torch.cuda.get_device_name(0))


def _micro_batches(text: str) -> dict[str, int]:
    out = dict(DEFAULT_MICRO)
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(
                f"--micro-batch {text!r}: {item!r} is not MODEL=N with N >= 1; "
                f"e.g. --micro-batch opt125m=8,opt1.3b=4"
            )
        out[name] = int(value)
    return out


def _remaining(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left < 20:
        raise SystemExit(
            f"bench/gpu_throughput.py: out of time budget before {what}; "
            f"raise --budget-s or run fewer --models"
        )
    return left


def _figures(tokens_per_s: float, fpt: float, device: str) -> dict[str, Any]:
    from slurmtrain.planning import flops

    mfu = flops.mfu(tokens_per_s, fpt, device_name=device, dtype="bf16")
    return {
        "tokens_per_s": tokens_per_s,
        "tflops": flops.tflops_per_gpu(tokens_per_s, fpt),
        "mfu": mfu,
    }


def run_ours(
    model: str, micro: int, warmup: int, steps: int, workdir: Path, deadline: float
) -> tuple[dict[str, Any], Path]:
    """The real entrypoint, one local GPU task; the rate between two metrics rows."""
    total = warmup + steps
    name = f"gpubench-{model.replace('.', '_')}"
    args = [
        sys.executable,
        "-m",
        "slurmtrain",
        f"model={model}",
        "gpus_per_node=1",
        f"data.seq_len={SEQ}",
        "data=synthetic",
        "deepspeed=zero2",
        "deepspeed.dtype=bf16",
        f"train.micro_batch_size={micro}",
        f"train.global_batch_size={micro}",
        f"train.max_steps={total}",
        f"train.log_interval={LOG_INTERVAL}",
        "checkpoint.interval_steps=0",
        "new_run=true",
        f"name={name}",
        f"runs_root={workdir}",
    ]
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            args,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=_remaining(deadline, f"ours/{model}"),
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit(
            f"ours/{model}: did not finish within the time budget:\n"
            f"{_captured(e.stdout)[-3000:]}{_captured(e.stderr)[-3000:]}"
        ) from e
    if done.returncode:
        raise SystemExit(
            f"ours/{model}: python -m slurmtrain failed ({done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-4000:]}"
        )
    run = max(workdir.glob(f"{name}/*/metrics.jsonl"), key=os.path.getmtime).parent
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    seconds = rows[total]["time"] - rows[warmup]["time"]
    tps = steps * micro * SEQ / seconds
    last = rows[total]
    return {
        "tokens_per_s": tps,
        "seconds_timed": seconds,
        "wall_s": time.monotonic() - t0,
        "logged_mfu": last.get("mfu"),
        "logged_tflops_per_gpu": last.get("tflops_per_gpu"),
        "peak_mem_bytes": last.get("peak_mem_bytes_max"),
    }, run


def _captured(output: bytes | str | None) -> str:
    """What a timed-out child wrote: TimeoutExpired holds bytes even for a text=True run."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def run_bare(run: Path, warmup: int, deadline: float, model: str) -> dict[str, Any]:
    """This file's --bare worker on the same run directory, as rank 0 of 1."""
    from slurmtrain.login.local_submit import free_port

    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PYTHONWARNINGS="ignore::FutureWarning",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    env.pop("DS_ACCELERATOR", None)
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--bare", str(run), str(warmup)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=_remaining(deadline, f"bare/{model}"),
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"bare/{model}: did not finish within the time budget") from e
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(
            f"bare/{model}: failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
    return dict(json.loads(lines[-1]), wall_s=time.monotonic() - t0)


def bare_worker(run_dir: str, warmup: int) -> None:
    """bench/bare_deepspeed_loop.py on the same run directory (it picks NCCL on a GPU run)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bare_deepspeed_loop import main as bare_main

    bare_main(run_dir, warmup)


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(results: list[dict[str, Any]]) -> None:
    head = (
        f"{'model':<9} {'micro':>5} | {'ours tok/s':>11} {'TFLOPS':>7} {'MFU':>6} | "
        f"{'bare tok/s':>11} {'TFLOPS':>7} {'MFU':>6} | {'ours/bare':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        o, b = r["ours"], r["bare"]
        print(
            f"{r['model']:<9} {r['micro_batch']:>5} | {o['tokens_per_s']:>11,.0f} "
            f"{o['tflops']:>7.1f} {_fmt(o['mfu'] and 100 * o['mfu'], '5.1f'):>5}% | "
            f"{b['tokens_per_s']:>11,.0f} {b['tflops']:>7.1f} "
            f"{_fmt(b['mfu'] and 100 * b['mfu'], '5.1f'):>5}% | "
            f"{o['tokens_per_s'] / b['tokens_per_s']:>9.3f}"
        )


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--bare":
        bare_worker(sys.argv[2], int(sys.argv[3]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="opt125m,opt1.3b")
    p.add_argument("--steps", type=int, default=30, help="timed steps after warm-up")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--micro-batch", default="", help="MODEL=N,... (default opt125m=8,opt1.3b=4)")
    p.add_argument("--budget-s", type=float, default=290.0, help="stop (exit 1) past this")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default bench/results/)")
    args = p.parse_args()
    if args.warmup % LOG_INTERVAL or args.steps % LOG_INTERVAL or args.warmup < LOG_INTERVAL:
        raise SystemExit(
            f"--warmup {args.warmup} / --steps {args.steps}: must be multiples of "
            f"{LOG_INTERVAL} (ours is timed between logged rows), warm-up >= {LOG_INTERVAL}"
        )
    device = require_gpu()  # before anything slow
    deadline = time.monotonic() + args.budget_s
    micro = _micro_batches(args.micro_batch)
    sys.path.insert(0, str(ROOT))
    from omegaconf import OmegaConf

    from slurmtrain.common.schema import ModelConfig
    from slurmtrain.planning import flops

    results = []
    with tempfile.TemporaryDirectory(prefix="gpubench-") as tmp:
        for m in filter(None, args.models.split(",")):
            mb = micro.get(m, 4)
            spec = OmegaConf.load(ROOT / "conf" / "model" / f"{m}.yaml")
            shape = ModelConfig(**OmegaConf.to_container(spec, resolve=True))  # type: ignore[arg-type]
            fpt = flops.flops_per_token(shape, SEQ)
            ours, run = run_ours(m, mb, args.warmup, args.steps, Path(tmp), deadline)
            bare = run_bare(run, args.warmup, deadline, m)
            ours.update(_figures(ours["tokens_per_s"], fpt, device))
            bare.update(_figures(bare["tokens_per_s"], fpt, device))
            results.append(
                {"model": m, "micro_batch": mb, "flops_per_token": fpt, "ours": ours, "bare": bare}
            )
            print(
                f"{m}: ours {ours['tokens_per_s']:,.0f} tok/s, bare "
                f"{bare['tokens_per_s']:,.0f} tok/s",
                flush=True,
            )
    import torch

    print_table(results)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    out = args.out or ROOT / "bench" / "results" / f"{dt.date.today().isoformat()}-{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "device": device,
                "date": dt.datetime.now().isoformat(timespec="seconds"),
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "seq_len": SEQ,
                "dtype": "bf16",
                "zero_stage": 2,
                "steps_timed": args.steps,
                "warmup": args.warmup,
                "peak_tflops": flops.detect_peak(device, "bf16"),
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
