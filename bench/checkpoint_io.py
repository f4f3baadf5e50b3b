"""Checkpoint write speed vs `dd` on the same disk, and how long saves block the loop, sync vs async.

    python bench/checkpoint_io.py [--dir DIR] [--models opt_tiny,opt125m] [--steps 12] [--every 4]

Each model trains twice through the real `python -m slurmtrain` (2 local CPU ranks), once with
synchronous saves and once with `checkpoint.async_save=true`; the figures come from the run's own
ledger (`checkpoint_saved`: bytes, seconds = time the loop was blocked, total_seconds = until
published) and metrics (step_time of the steps that ran while a background save was writing).
`dd if=/dev/zero bs=1M count=N conv=fsync` writes as many bytes as one checkpoint to the same
directory: the ceiling a checkpoint write could reach there, measured as a save writes (one dd per
rank at once, new files, earlier ones kept, after a pause; see `dd_mb_s`) and, for reference, into
pages just freed by a deleted file. Last, the newest sync checkpoint of
each model is converted to DeepSpeed's universal format (what a world-size change costs at start).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL_ARGS = {"opt125m": ["data.seq_len=128"]}


PAUSE_S = 5.0  # longer than virtio-balloon's free page reporting delay (2 s)


def dd_mb_s(
    directory: Path, megabytes: int, streams: int = 2, repeat: int = 3
) -> tuple[float, float]:
    """dd's MB/s under a checkpoint's conditions (median of `repeat`), and into just-freed pages.

    Like a checkpoint: one dd per rank at once (`streams`, the bytes split evenly), into new files
    while the earlier ones stay (keep_last), after a pause. The pause matters on this VM: its
    balloon driver hands free pages back to the host ~2 s after they are freed, and writing into
    such a page costs a host fault (measured here: 2.4 GB/s into pages freed just before, 740 MB/s
    six seconds later). A save after minutes of training writes into such pages.
    "reused": one dd at once, each file deleted just before the next: the optimistic ceiling.
    """
    written: list[Path] = []
    fair = []
    for i in range(repeat):
        time.sleep(PAUSE_S)
        targets = [directory / f"dd{i}_{k}.bin" for k in range(streams)]
        started = time.perf_counter()
        procs = [_dd(target, max(1, megabytes // streams)) for target in targets]
        for proc in procs:
            _check(proc)
        fair.append(megabytes / (time.perf_counter() - started))
        written += targets
    for target in written:
        target.unlink(missing_ok=True)
    reused = []
    for _ in range(repeat):
        started = time.perf_counter()
        _check(_dd(written[0], megabytes))
        reused.append(megabytes / (time.perf_counter() - started))
        written[0].unlink(missing_ok=True)
    return statistics.median(fair), statistics.median(reused)


def _dd(target: Path, megabytes: int) -> subprocess.Popen:
    return subprocess.Popen(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={megabytes}", "conv=fsync"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check(proc: subprocess.Popen) -> None:
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"dd failed: {err.strip()}")


def train(workdir: Path, model: str, mode: str, steps: int, every: int) -> Path:
    args = [
        sys.executable,
        "-m",
        "slurmtrain",
        f"model={model}",
        f"train.max_steps={steps}",
        "train.log_interval=1",
        f"checkpoint.interval_steps={every}",
        "checkpoint.keep_last=2",
        f"checkpoint.async_save={'true' if mode == 'async' else 'false'}",
        f"name=io-{model}-{mode}",
        f"runs_root={workdir}",
        *MODEL_ARGS.get(model, []),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"slurmtrain failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    [run] = (workdir / f"io-{model}-{mode}").glob("*/config.yaml")
    return run.parent


def universal_seconds(run: Path) -> float:
    sys.path.insert(0, str(ROOT))
    from slurmtrain.compute.checkpoint import format as ckpt
    from slurmtrain.compute.checkpoint import reshape

    found = ckpt.find_resumable(run / "checkpoints", full=False)
    assert found.path is not None, f"no checkpoint in {run}"
    return reshape.convert(found.path, found.manifest).seconds


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(run: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from slurmtrain.common.rundir import RunDir

    saves = RunDir(run).events("checkpoint_saved")
    metrics = rows(run / "metrics.jsonl")
    windows = [(e["time"] - e["total_seconds"] + e["seconds"], e["time"]) for e in saves]

    def overlaps(m: dict) -> bool:  # the step ran (partly) while a save was still being written
        return any(m["time"] - m["step_time"] < b and m["time"] > a for a, b in windows)

    during = [m["step_time"] for m in metrics[1:] if overlaps(m)]
    outside = [m["step_time"] for m in metrics[1:] if not overlaps(m)]
    mb = statistics.mean(e["bytes"] for e in saves) / 1e6
    parts = {
        k: round(statistics.mean(e.get("write_seconds", {}).get(k, 0.0) for e in saves), 2)
        for k in ("serialize", "hash", "fsync")
    }
    return {
        "saves": len(saves),
        "mb": mb,
        "blocked": statistics.mean(e["seconds"] for e in saves),
        "blocked_max": max(e["seconds"] for e in saves),
        # the first save allocates the async host pool (page faults); later ones reuse it
        "blocked_later": statistics.mean(e["seconds"] for e in saves[1:])
        if saves[1:]
        else float("nan"),
        "waited": statistics.mean(e.get("wait_seconds", 0.0) for e in saves),
        "total": statistics.mean(e["total_seconds"] for e in saves),
        "write_mb_s": mb / statistics.mean(e["total_seconds"] for e in saves),
        "step": statistics.median(outside) if outside else float("nan"),
        "step_during": statistics.median(during) if during else float("nan"),
        "parts": parts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to write (default: a temp "
        "directory under the current one, i.e. the disk runs/ would live on)",
    )
    parser.add_argument("--models", default="opt_tiny,opt125m")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4, help="checkpoint.interval_steps")
    opts = parser.parse_args()
    base = opts.dir or Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="ckpt-io-") as tmp:
        workdir = Path(tmp)
        results, universal = {}, {}
        for model in opts.models.split(","):
            for mode in ("sync", "async"):
                run = train(workdir, model, mode, opts.steps, opts.every)
                results[model, mode] = figures(run)
                if mode == "sync":
                    universal[model] = universal_seconds(run)
        print(
            f"checkpoint I/O on {workdir.parent} (2 CPU ranks, fp32, ZeRO-2; "
            f"means over the saves of {opts.steps} steps, one every {opts.every})"
        )
        head = (
            f"{'model':9} {'mode':5} {'saves':>5} {'MB/save':>8} {'blocked s':>10} "
            f"{'max s':>7} {'waited s':>9} {'total s':>8} {'write MB/s':>10} "
            f"{'dd':>7} {'ratio':>6} {'dd reuse':>8} {'step s':>7} {'step s*':>8}"
        )
        print(head)
        print("-" * len(head))
        for (model, mode), f in results.items():
            dd_new, dd_reused = dd_mb_s(workdir, max(1, round(f["mb"])))
            print(
                f"{model:9} {mode:5} {f['saves']:>5} {f['mb']:>8.1f} {f['blocked']:>10.3f} "
                f"{f['blocked_max']:>7.3f} {f['waited']:>9.3f} {f['total']:>8.3f} "
                f"{f['write_mb_s']:>10.1f} {dd_new:>7.1f} {f['write_mb_s'] / dd_new:>6.2f} "
                f"{dd_reused:>8.1f} {f['step']:>7.3f} {f['step_during']:>8.3f}"
            )
            print(f"{'':15} slowest rank's write: {f['parts']}")
        for model in dict.fromkeys(m for m, _ in results):
            sync, later = results[model, "sync"], results[model, "async"]
            print(
                f"{model}: async blocked / sync blocked = {later['blocked'] / sync['blocked']:.3f} "
                f"(all saves), {later['blocked_later'] / sync['blocked_later']:.3f} (after the "
                f"first, which allocates the host pool)"
            )
        for model, seconds in universal.items():
            print(
                f"{model}: universal conversion of one checkpoint (ds_to_universal, "
                f"--inject_missing_state): {seconds:.1f} s"
            )
        print(
            "blocked s: the loop waited (sync: the whole save; async: host copy + waiting for "
            "the previous save);\nwaited s: part of it spent waiting for the previous save; "
            "total s: until published;\nwrite MB/s: checkpoint bytes / total s; dd: as many bytes "
            "with conv=fsync, one dd per rank at once, into new files after a 5 s pause (as a "
            "save writes); ratio: write / dd;\ndd reuse: one dd, each file deleted just before "
            "the next (pages reused: optimistic);\nstep s: median step time; step s*: median step time of "
            "steps that ran while a save was being written (async only)"
        )


if __name__ == "__main__":
    main()
