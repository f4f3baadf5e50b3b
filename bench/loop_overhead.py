"""slurmtrain's training loop vs a bare DeepSpeed loop: tokens/s, side by side, in one run.

    python bench/loop_overhead.py [--steps 150] [--warmup 30] [--rounds 2]

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ours(workdir: Path, steps: int, warmup: int) -> tuple[float, Path]:
    args = [sys.executable, "-m", "slurmtrain", f"train.max_steps={steps}", "train.log_interval=1",
            "checkpoint.interval_steps=0", "new_run=true", f"runs_root={workdir}"]
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    run = max(workdir.glob("demo/*/metrics.jsonl"), key=os.path.getmtime).parent
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    # metrics row k is written after step k; steps warmup+1..steps run between rows warmup and steps.
    seconds = rows[steps]["time"] - rows[warmup]["time"]
    cfg_tokens = _tokens_per_step(run)
    return (steps - warmup) * cfg_tokens / seconds, run


def _tokens_per_step(run: Path) -> int:
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    return cfg["train"]["global_batch_size"] * cfg["data"]["seq_len"]


def bare(run: Path, warmup: int, port: int) -> float:
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu",
                   PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "bench" / "bare_deepspeed_loop.py"),
                                       str(run), str(warmup)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
    out = [p.communicate()[0] for p in procs]
    line = [x for x in out[0].splitlines() if x.startswith("{")][-1]
    return json.loads(line)["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            ours_tps, run = ours(Path(tmp), args.steps, args.warmup)
            bare_tps = bare(run, args.warmup, 29700 + i)
            ratios.append(ours_tps / bare_tps)
            print(f"round {i + 1}: slurmtrain {ours_tps:,.0f} tok/s | bare DeepSpeed "
                  f"{bare_tps:,.0f} tok/s | ratio {ours_tps / bare_tps:.3f}", flush=True)
    print(f"median ratio slurmtrain / bare DeepSpeed: {statistics.median(ratios):.3f} "
          f"({args.rounds} rounds, {args.steps} steps, {args.warmup} warm-up, 2 CPU processes)")


if __name__ == "__main__":
    main()
