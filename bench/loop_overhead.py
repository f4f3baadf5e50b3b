"""slurmtrain's training loop vs a bare DeepSpeed loop: tokens/s, side by side, in one run.

    python bench/loop_overhead.py [--steps 150] [--warmup 30] [--rounds 2] [--log-interval 10]

Same tiny OPT, DeepSpeed config, data and 2 CPU processes. Ours is the real entrypoint launched by
`python -m slurmtrain` (checkpoints only at the end, which falls outside the timed window); its rate
is taken from metrics.jsonl timestamps between the same steps the bare loop times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ours(workdir: Path, steps: int, warmup: int, log_interval: int) -> tuple[float, Path, float]:
    if warmup % log_interval or steps % log_interval:
        raise SystemExit(
            f"--warmup {warmup} and --steps {steps}: must be multiples of "
            f"--log-interval {log_interval} (the rate is read between logged rows)"
        )
    args = [
        sys.executable,
        "-m",
        "slurmtrain",
        f"train.max_steps={steps}",
        f"train.log_interval={log_interval}",
        "checkpoint.interval_steps=0",
        "cluster=local",  # this machine (cluster=auto would submit to the test Slurm cluster)
        "new_run=true",
        f"runs_root={workdir}",
    ]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
        login_share = _login_side_share(proc, workdir, warmup, steps)
        if proc.wait():
            out.seek(0)
            raise SystemExit(f"slurmtrain failed ({proc.returncode}):\n{out.read()}")
    run = max(workdir.glob("demo/*/metrics.jsonl"), key=os.path.getmtime).parent
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    # metrics row k is written after step k; steps warmup+1..steps run between rows warmup and steps.
    seconds = rows[steps]["time"] - rows[warmup]["time"]
    cfg_tokens = _tokens_per_step(run)
    return (steps - warmup) * cfg_tokens / seconds, run, login_share


def _last_step(workdir: Path) -> int:
    files = list(workdir.glob("demo/*/metrics.jsonl"))
    if not files:
        return 0
    lines = max(files, key=os.path.getmtime).read_text().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def _login_side_share(proc: subprocess.Popen, workdir: Path, warmup: int, steps: int) -> float:
    """CPU share (of one core) of the processes that are not ranks, between the timed rows: the
    login-side `python -m slurmtrain` (progress display) and submitit's local controller."""
    import psutil

    def cpu() -> float:
        try:
            login = psutil.Process(proc.pid)
            side = [login] + [
                c for c in login.children() if "submitit.local" in " ".join(c.cmdline())
            ]
            return sum(sum(p.cpu_times()[:2]) for p in side)
        except psutil.Error:
            return float("nan")

    first = last = None
    while proc.poll() is None:
        step = _last_step(workdir)
        if first is None and step >= warmup:
            first = (time.perf_counter(), cpu())
        elif first is not None and step < steps:
            last = (time.perf_counter(), cpu())
        time.sleep(1.0)
    if first is None or last is None or last[0] <= first[0]:
        return float("nan")
    return (last[1] - first[1]) / (last[0] - first[0])


def _tokens_per_step(run: Path) -> int:
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    return cfg["train"]["global_batch_size"] * cfg["data"]["seq_len"]


def bare(run: Path, warmup: int, port: int) -> float:
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            DS_ACCELERATOR="cpu",
            PYTHONWARNINGS="ignore",
            PYTHONPATH=str(ROOT),
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "bench" / "bare_deepspeed_loop.py"),
                    str(run),
                    str(warmup),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    out = [p.communicate()[0] for p in procs]
    line = [x for x in out[0].splitlines() if x.startswith("{")][-1]
    return json.loads(line)["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--log-interval", type=int, default=10, help="train.log_interval of ours")
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            ours_tps, run, login_share = ours(Path(tmp), args.steps, args.warmup, args.log_interval)
            bare_tps = bare(run, args.warmup, 29700 + i)
            ratios.append(ours_tps / bare_tps)
            print(
                f"round {i + 1}: slurmtrain {ours_tps:,.0f} tok/s | bare DeepSpeed "
                f"{bare_tps:,.0f} tok/s | ratio {ours_tps / bare_tps:.3f} | login side + "
                f"controller {100 * login_share:.1f}% of a core",
                flush=True,
            )
    print(
        f"median ratio slurmtrain / bare DeepSpeed: {statistics.median(ratios):.3f} "
        f"({args.rounds} rounds, {args.steps} steps, {args.warmup} warm-up, log interval "
        f"{args.log_interval}, 2 CPU processes)"
    )


if __name__ == "__main__":
    main()
