"""slurmtrain's training loop vs a bare DeepSpeed loop: tokens/s, side by side, in one run.

    python bench/loop_overhead.py [--steps 150] [--warmup 30] [--rounds 3] [--log-interval 10]
                                  [--eval-interval 0] [--concurrent]

Same tiny OPT, DeepSpeed config (timers included), micro batch, grad accumulation, training
windows and 2 CPU processes. Ours is the real entrypoint launched by `python -m slurmtrain`
(metrics.jsonl + TensorBoard every log interval, divergence check, stop-signal agreement,
watchdog, straggler/perf tracking; checkpoints only at the end, which falls outside the timed
window); its rate is taken from metrics.jsonl timestamps between the same steps the bare loop
times (warm-up excluded on both sides). The held-out evaluation is off in ours by default
(`--eval-interval 0`): like a checkpoint it is work the bare loop does not do (forwards over the
validation windows), not loop overhead; `--eval-interval 50` (the default config's) puts it back in
the timed window. Rounds alternate which side runs first, so a drifting load on a shared machine
does not always favour the same side; the median of the per-round ratios is the figure. On a
machine other people load, a round's two halves see different loads (ratios from 0.5 to 1.7 were
seen here at a load average of 10-19 on 2 cores); `--concurrent` runs both loops at the same time
over the same seconds instead, so the load falls on both alike (see `concurrent`).
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
from typing import Callable, Optional, cast

from loop_twin import Result, Settings, zero_stage

ROOT = Path(__file__).resolve().parents[1]


def ours(
    workdir: Path,
    steps: int,
    warmup: int,
    log_interval: int,
    eval_interval: int,
    alongside: Optional[Callable[[Path], None]] = None,
) -> tuple[float, list[float], Path, float, tuple[float, float]]:
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
        f"train.eval_interval={eval_interval}",
        "checkpoint.interval_steps=0",
        "cluster=local",  # this machine (cluster=auto would submit to the test Slurm cluster)
        "new_run=true",
        f"runs_root={workdir}",
    ]
    before = set(workdir.glob("demo/*"))
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
        if alongside is not None:  # started as soon as the run directory has its config
            while proc.poll() is None:
                new = [d for d in workdir.glob("demo/*") if d not in before]
                if new and (new[0] / "config.yaml").exists():
                    alongside(new[0])
                    break
                time.sleep(0.2)
        login_share = _login_side_share(proc, workdir, warmup, steps)
        if proc.wait():
            out.seek(0)
            raise SystemExit(f"slurmtrain failed ({proc.returncode}):\n{out.read()}")
    run = max(workdir.glob("demo/*/metrics.jsonl"), key=os.path.getmtime).parent
    stamped = _row_times(run)
    # metrics row k is written after step k; steps warmup+1..steps run between rows warmup and steps.
    seconds = stamped[steps] - stamped[warmup]
    cfg_tokens = _tokens_per_step(run)
    marks = [stamped[s] for s in range(warmup, steps + 1, log_interval)]
    intervals = [b - a for a, b in zip(marks, marks[1:])]
    window = (stamped[warmup], stamped[steps])
    return (steps - warmup) * cfg_tokens / seconds, intervals, run, login_share, window


def _row_times(run: Path) -> dict[int, float]:
    """When each metrics row was written (its `time`), by step."""
    from metric_fields import integer, number

    from slurmtrain.common.jsonl import read_jsonl

    stamped = {}
    for row in read_jsonl(run / "metrics.jsonl"):
        step = integer(row, "step")
        if step is not None:
            stamped[step] = number(row, "time")
    return stamped


def _last_step(workdir: Path) -> int:
    from metric_fields import integer

    files = list(workdir.glob("demo/*/metrics.jsonl"))
    if not files:
        return 0
    lines = max(files, key=os.path.getmtime).read_text().splitlines()
    return (integer(json.loads(lines[-1]), "step") or 0) if lines else 0


def _login_side_share(proc: subprocess.Popen[str], workdir: Path, warmup: int, steps: int) -> float:
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
    from slurmtrain.common.schema import load_run_config

    cfg = load_run_config(str(run / "config.yaml"))
    assert cfg.train.global_batch_size is not None  # resolved before config.yaml was written
    return cfg.train.global_batch_size * cfg.data.seq_len


def bare(run: Path, warmup: int, port: int) -> tuple[float, list[float], Settings]:
    result = finish_bare(start_bare(run, warmup, port))
    return result["tokens_per_s"], result["intervals_s"], result["settings"]


def start_bare(run: Path, warmup: int, port: int, until: str = "") -> list[subprocess.Popen[str]]:
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
        script = str(ROOT / "bench" / "loop_twin.py")
        procs.append(
            subprocess.Popen(
                [sys.executable, script, str(run), str(warmup)] + ([until] if until else []),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    return procs


def finish_bare(procs: list[subprocess.Popen[str]]) -> Result:
    out = [p.communicate()[0] for p in procs]
    lines = [x for x in out[0].splitlines() if x.startswith("{")]
    if any(p.returncode for p in procs) or not lines:
        raise SystemExit(f"bare DeepSpeed loop failed ({[p.returncode for p in procs]})")
    return cast(Result, json.loads(lines[-1]))  # the line loop_twin.py printed


def bare_in_window(
    stamps: list[float], window: tuple[float, float], warmup: int, tokens: int
) -> Optional[float]:
    """The bare loop's tokens/s over slurmtrain's timed window (steps counted by interpolating
    its per-step end times), or None when it was still warming up or had stopped by then."""
    import numpy as np

    lo, hi = window
    if len(stamps) <= warmup or stamps[warmup] > lo or stamps[-1] < hi:
        return None
    done = np.interp([lo, hi], stamps, np.arange(1, len(stamps) + 1))
    return float(done[1] - done[0]) * tokens / (hi - lo)


def same_settings(run: Path, bare_settings: Settings) -> None:
    """The bare loop trained with slurmtrain's micro batch, accumulation, batch and timers."""
    from slurmtrain.common import ds_config
    from slurmtrain.common.derived import grad_accumulation
    from slurmtrain.common.schema import load_run_config

    cfg = load_run_config(str(run / "config.yaml"))
    world = bare_settings["world"]
    config = ds_config.build(cfg, world)
    assert cfg.train.global_batch_size is not None  # resolved before config.yaml was written
    ours_settings: Settings = {
        "micro_batch": cfg.train.micro_batch_size,
        "grad_accumulation": grad_accumulation(cfg, world),
        "global_batch": cfg.train.global_batch_size,
        "seq_len": cfg.data.seq_len,
        "world": world,
        "wall_clock_breakdown": bool(config.get("wall_clock_breakdown")),
        "zero_stage": zero_stage(config),
    }
    if ours_settings != bare_settings:
        raise SystemExit(f"unfair comparison: slurmtrain {ours_settings} vs bare {bare_settings}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-interval", type=int, default=10, help="train.log_interval of ours")
    parser.add_argument(
        "--eval-interval", type=int, default=0, help="train.eval_interval of ours (0: off)"
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="run the bare loop alongside slurmtrain and time both over the same seconds "
        "(for a machine others load: both sides share whatever load there is)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.concurrent:
        return concurrent(args)
    ratios: list[float] = []
    robust: list[float] = []
    run: Optional[Path] = None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            # Odd rounds run slurmtrain first, even rounds the bare loop (which needs a run
            # directory's config: the first round's, the same every round).
            bare_on = run if i % 2 else None
            first_ours = bare_on is None
            if bare_on is not None:
                bare_tps, bare_iv, settings = bare(bare_on, args.warmup, 29700 + i)
            ours_tps, ours_iv, run, login_share, _ = ours(
                Path(tmp), args.steps, args.warmup, args.log_interval, args.eval_interval
            )
            if first_ours:
                bare_tps, bare_iv, settings = bare(run, args.warmup, 29700 + i)
            same_settings(run, settings)
            ratios.append(ours_tps / bare_tps)
            # The median log interval of each side: a burst of load from another process slows
            # a few intervals, not the median; the whole-window ratio above takes every second.
            robust.append(statistics.median(bare_iv) / statistics.median(ours_iv))
            print(
                f"round {i + 1} ({'slurmtrain' if first_ours else 'bare'} first): slurmtrain "
                f"{ours_tps:,.0f} tok/s | bare DeepSpeed {bare_tps:,.0f} tok/s | ratio "
                f"{ours_tps / bare_tps:.3f} | median-interval ratio {robust[-1]:.3f} | login "
                f"side + controller {100 * login_share:.1f}% of a core",
                flush=True,
            )
    print(
        f"median median-interval ratio: {statistics.median(robust):.3f} (each side's median "
        f"time per {args.log_interval} steps; less moved by other processes' bursts)"
    )
    _summary(args, ratios, settings, "interleaved")


def _summary(args: argparse.Namespace, ratios: list[float], settings: Settings, how: str) -> None:
    print(
        f"median ratio slurmtrain / bare DeepSpeed: {statistics.median(ratios):.3f} "
        f"({len(ratios)} of {args.rounds} rounds {how}, {args.steps} steps, {args.warmup} "
        f"warm-up, log interval {args.log_interval}, eval interval {args.eval_interval}, 2 CPU "
        f"processes each; micro batch {settings['micro_batch']} x accumulation "
        f"{settings['grad_accumulation']}, timers "
        f"{'on' if settings['wall_clock_breakdown'] else 'off'} on both sides)"
    )


def concurrent(args: argparse.Namespace) -> None:
    """Both loops at once, each on 2 processes: the bare loop starts as soon as slurmtrain's run
    directory has its config and trains until slurmtrain has finished; its tokens/s is taken over
    the seconds between slurmtrain's rows WARMUP and STEPS. Whatever else loads the machine then
    loads both sides alike (the scheduler shares the cores fairly), so the ratio tells the CPU
    each step costs on either side rather than what other processes did in between. Two bare
    loops run this way gave 0.993 here over 60 s at a load average of 19. The bare loop starts
    first, so it is further into training during the window: give slurmtrain a longer warm-up
    (`--steps 300 --warmup 100`)."""
    ratios: list[float] = []
    settings: Optional[Settings] = None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            stop = Path(tmp) / f"stop{i}"
            started: list[list[subprocess.Popen[str]]] = []

            def launch(
                run: Path,
                port: int = 29750 + i,
                box: list[list[subprocess.Popen[str]]] = started,
                until: str = str(stop),
            ) -> None:
                box.append(start_bare(run, args.warmup, port, until))

            try:
                ours_tps, _, run, login_share, window = ours(
                    Path(tmp),
                    args.steps,
                    args.warmup,
                    args.log_interval,
                    args.eval_interval,
                    launch,
                )
            finally:
                stop.touch()  # the bare loop stops at its next step, on both ranks
            if not started:
                raise SystemExit("slurmtrain finished before its run directory was seen")
            result = finish_bare(started[0])
            settings = result["settings"]
            same_settings(run, settings)
            bare_tps = bare_in_window(
                result["step_end_times"], window, args.warmup, _tokens_per_step(run)
            )
            if bare_tps is None:
                print(f"round {i + 1}: the bare loop was not in steady state over the window")
                continue
            ratios.append(ours_tps / bare_tps)
            print(
                f"round {i + 1} (concurrent): slurmtrain {ours_tps:,.0f} tok/s | bare DeepSpeed "
                f"{bare_tps:,.0f} tok/s | ratio {ours_tps / bare_tps:.3f} | login side + "
                f"controller {100 * login_share:.1f}% of a core",
                flush=True,
            )
    if ratios and settings is not None:
        _summary(args, ratios, settings, "concurrent")


if __name__ == "__main__":
    main()
