"""One GPU, one sitting: throughput, MFU and memory vs plan, a bitwise resume check, a binding check.

    python bench/gpu_check.py            # a 1-GPU machine (bench/gpu_check.sh installs what is missing)
    python bench/gpu_check.py --dry      # the same steps on this machine's CPU with opt_tiny

For opt125m and opt1.3b, bf16, seq 2048, ZeRO-2 and ZeRO-3, the real entrypoint (`python -m
slurmtrain cluster=local gpus_per_node=1 ...`, synthetic data) trains WARMUP + STEPS steps; printed:
tokens/s per GPU, TFLOP/s, MFU (metrics.jsonl, last interval: steady state), peak memory measured
vs planned (the `memory_checked` ledger event of train.memory_check_step). Resume: one run of 2N
steps against one paused at N and resumed: losses of steps N+1..2N compared bitwise (and steps 1..N,
which tells kernel nondeterminism from a resume bug). Binding: a task that sees one GPU with local id
1 gets device 0 from compute.distributed.device_index and computes on it, where `cuda:1` fails.
Writes everything as JSON to --out too. Exit 0 when every check ran, 1 when one failed.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPU = {
    "models": {"opt125m": 16, "opt1.3b": 8},  # model -> micro batch (H200: fits with headroom)
    "stages": (2, 3),
    "base": ["gpus_per_node=1", "data=synthetic", "data.seq_len=2048", "deepspeed.dtype=bf16"],
    "warmup": 10,
    "steps": 20,
    "log": 10,
    "resume": ("opt125m", 8, 5),  # model, micro batch, N
}
DRY = {
    "models": {"opt_tiny": 4},
    "stages": (2, 3),
    "base": ["gpus_per_node=0", "cluster.cpu_tasks_per_node=1", "data.seq_len=128"],
    "warmup": 4,
    "steps": 4,
    "log": 4,
    "resume": ("opt_tiny", 4, 3),
}


def slurmtrain(args: list[str], work: Path, timeout: float = 600, pausing: bool = False) -> Path:
    """`python -m slurmtrain` on this machine; the run directory it trained. `pausing`: the run
    stops at train.pause_at_step (the login side exits non-zero: the run is not finished)."""
    name = next(a.split("=", 1)[1] for a in args if a.startswith("name="))
    cmd = [sys.executable, "-m", "slurmtrain", "cluster=local", f"runs_root={work}", *args]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout)
    run = max(work.glob(f"{name}/*/config.yaml"), key=os.path.getmtime).parent
    if done.returncode and not (pausing and events(run, "paused")):
        raise RuntimeError(
            f"{' '.join(args)} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    print(f"  ({' '.join(args[-4:])}: {time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return run


def rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def events(run: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run / "ledger.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def throughput(p: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    out = []
    total = p["warmup"] + p["steps"]
    for model, micro in p["models"].items():
        for stage in p["stages"]:
            run = slurmtrain(
                [
                    *p["base"],
                    f"model={model}",
                    f"deepspeed=zero{stage}",
                    f"train.micro_batch_size={micro}",
                    f"train.global_batch_size={micro}",
                    f"train.max_steps={total}",
                    f"train.log_interval={p['log']}",
                    f"train.memory_check_step={p['warmup']}",
                    "checkpoint.interval_steps=0",
                    "new_run=true",
                    f"name=tp-{model.replace('.', '_')}-z{stage}",
                ],
                work,
            )
            last = rows(run)[-1]
            [mem] = events(run, "memory_checked") or [{}]
            out.append(
                {
                    "model": model,
                    "zero": stage,
                    "micro": micro,
                    "tokens_per_s_per_gpu": last.get("tokens_per_s_per_gpu"),
                    "tflops_per_gpu": last.get("tflops_per_gpu"),
                    "mfu": last.get("mfu"),
                    "peak_measured_gib": (mem.get("measured_bytes") or 0) / 2**30,
                    "peak_planned_gib": (mem.get("planned_bytes") or 0) / 2**30,
                    "memory_ratio": mem.get("ratio"),
                }
            )
            r = out[-1]
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
            print(
                f"{model:<8} ZeRO-{stage} micro {micro:>2} | {r['tokens_per_s_per_gpu']:>10,.0f} "
                f"tok/s/GPU | {r['tflops_per_gpu']:>7.1f} TFLOP/s | MFU {mfu:>6} | peak "
                f"{r['peak_measured_gib']:.2f} GiB measured / {r['peak_planned_gib']:.2f} planned "
                f"(ratio {r['memory_ratio']})",
                flush=True,
            )
    return out


def resume(p: dict[str, Any], work: Path) -> dict[str, Any]:
    model, micro, n = p["resume"]
    common = [
        *p["base"],
        f"model={model}",
        "deepspeed=zero2",
        f"train.micro_batch_size={micro}",
        f"train.global_batch_size={micro}",
        f"train.max_steps={2 * n}",
        "train.log_interval=1",
        f"checkpoint.interval_steps={n}",
    ]
    whole = slurmtrain([*common, "new_run=true", "name=resume-whole"], work)
    cut = [*common, f"train.pause_at_step={n}", "name=resume-cut"]
    first = slurmtrain(cut, work, pausing=True)  # a fresh work dir: no new_run needed
    again = slurmtrain(cut, work)  # the same command again: resumes the paused run
    assert again == first, (again, first)
    a = {r["step"]: r["loss"] for r in rows(whole)}
    b = {r["step"]: r["loss"] for r in rows(first)}  # both attempts append to one metrics.jsonl
    before = [a[s] == b[s] for s in range(1, n + 1)]
    after = [a[s] == b[s] for s in range(n + 1, 2 * n + 1)]
    diff = max(abs(a[s] - b[s]) for s in range(1, 2 * n + 1))
    loaded = events(first, "checkpoint_loaded")
    result = {
        "steps_1_to_n_bitwise": all(before),
        "resumed_steps_bitwise": all(after),
        "max_abs_loss_diff": diff,
        "resumed_from": loaded[0]["step"] if loaded else None,
        "ok": all(after) and bool(loaded),
    }
    print(
        f"resume {model} ZeRO-2: paused at {n}, resumed from step {result['resumed_from']}; "
        f"steps {n + 1}-{2 * n} bitwise equal to an uninterrupted run: "
        f"{result['resumed_steps_bitwise']} (steps 1-{n}: {result['steps_1_to_n_bitwise']}; "
        f"max |diff| {diff:.2e})",
        flush=True,
    )
    return result


_BINDING = r"""
import os, torch
from slurmtrain.compute.distributed import device_index
local = int(os.environ["SLURM_LOCALID"])
gpu = torch.cuda.is_available()
count = torch.cuda.device_count() if gpu else 1
index = device_index(os.environ, count, local)
device = torch.device("cuda", index) if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)
x = torch.randn(256, 256, device=device)
value = float((x @ x).sum())
naive = "n/a (CPU)"
if gpu:
    try:
        torch.zeros(1, device=torch.device("cuda", local))
        naive = "worked"
    except Exception as e:
        naive = type(e).__name__ + ": " + str(e).splitlines()[0]
print({"local_id": local, "visible": count, "device": str(device), "computed": value == value,
       "cuda_local_id": naive})
"""


def binding() -> dict[str, Any]:
    # The site bound one GPU to this task (the second of two on the node): it sees one device.
    env = dict(
        os.environ,
        SLURM_LOCALID="1",
        LOCAL_RANK="1",
        SLURM_NTASKS_PER_NODE="2",
        CUDA_VISIBLE_DEVICES="0",
    )
    done = subprocess.run(
        [sys.executable, "-c", _BINDING], env=env, capture_output=True, text=True, timeout=300
    )
    line = (done.stdout.strip().splitlines() or [done.stderr[-500:]])[-1]
    ok = done.returncode == 0 and "'computed': True" in line
    print(f"binding: one visible GPU, local id 1: {line} -> {'ok' if ok else 'FAILED'}", flush=True)
    return {"ok": ok, "output": line}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dry", action="store_true", help="CPU, opt_tiny: the same steps")
    parser.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = parser.parse_args()
    p = DRY if args.dry else GPU
    if not args.dry:
        import torch

        if not torch.cuda.is_available():
            print("bench/gpu_check.py: no CUDA GPU visible; use --dry on a CPU", file=sys.stderr)
            return 2
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    t0 = time.monotonic()
    report: dict[str, Any] = {"dry": args.dry}
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
        work = Path(tmp)
        for name, fn in (
            ("throughput", lambda: throughput(p, work)),
            ("resume", lambda: resume(p, work)),
            ("binding", binding),
        ):
            try:
                report[name] = fn()
            except Exception as e:  # one check failing still prints the others
                failed = True
                report[name] = {"error": str(e)[-3000:]}
                print(f"{name}: FAILED: {str(e)[-3000:]}", flush=True)
    failed = failed or not report["resume"].get("ok") or not report["binding"].get("ok")
    report["seconds"] = time.monotonic() - t0
    print(f"gpu_check: {'FAILED' if failed else 'ok'} in {report['seconds']:.0f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
