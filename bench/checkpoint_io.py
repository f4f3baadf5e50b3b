"""Checkpoint save and load speed against `dd` on the same disk, and the async saves' loop stall.

    python bench/checkpoint_io.py [--dir DIR] [--models opt125m,opt1.3b] [--steps 4] [--every 2]
        [--dd-rounds 2] [--phases sync,async,load,universal]

The defaults (sync saves only, two of them) keep a run to a few minutes on an idle 2-core machine.

Each model trains through the real `python -m slurmtrain` (cluster=local, 2 CPU ranks): once with
synchronous saves (it pauses at the last step: `train.pause_at_step`); with `--phases async` once
with `checkpoint.async_save=true`; with `--phases load` the paused sync run is started again, which
loads its newest checkpoint (its files evicted from the page cache first: a cold load, as after a
node swap). Figures come from the runs' own ledgers: `checkpoint_saved` (bytes; seconds = time
the loop was blocked; total_seconds = until published) and `checkpoint_loaded` (seconds). The dd
reference writes the same bytes the way a save does (one `dd conv=fsync` per rank at once, new
files, after a pause: see `dd_mb_s`), `--dd-rounds` times just before the sync run (`DD_MB`'s bytes
for the model, `--dd-mb` for others, into the runs' parent directory) and after each training run
(the sync save's bytes, into its `checkpoints/`): interleaved with the saves, on the same
filesystem. The ratio uses the median of those just before and after the sync run, and their spread
((max - min) / median) says whether the machine was quiet enough to judge: above `SPREAD_LIMIT` the
ratio is printed but flagged. `--phases` picks the runs after the sync one (`universal`: the sync
checkpoint converted to DeepSpeed's universal format); `--phases sync` is the ratio alone. `opt1.3b`
runs its shapes (hidden 2048, ffn 8192, vocab 50272) with 2 of its 24 layers: the whole model with 2
CPU ranks does not fit a 24 GB machine (said in the output too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmtrain.common import events  # noqa: E402

R = TypeVar("R", bound=events.Row)

BATCH = ["train.global_batch_size=8", "train.micro_batch_size=4"]  # recipes use 0.5M tokens a step
MODEL_ARGS = {
    "opt125m": ["data.seq_len=128"],
    "opt1.3b": ["data.seq_len=128", "model.num_layers=2"],  # its shapes, 2 of 24 layers
}
SLICES = {  # what a model's run is, where it is not the whole model (printed with the figures)
    "opt1.3b": "opt1.3b's shapes (hidden 2048, ffn 8192, vocab 50272) with 2 of its 24 layers: "
    "the whole model's states (~21 GB with Adam) do not fit this 24 GB machine with 2 CPU ranks",
}
DD_MB = {
    "opt_tiny": 3,
    "opt125m": 1503,
    "opt1.3b": 2500,
}  # a sync save's bytes (2 ranks): dd's before the run
SPREAD_LIMIT = 0.3  # dd runs further apart than this: a busy machine, the ratio is not judged


PAUSE_S = 5.0  # longer than virtio-balloon's free page reporting delay (2 s)


def dd_mb_s(directory: Path, megabytes: int, streams: int = 2, direct: bool = False) -> float:
    """dd's MB/s under a checkpoint's conditions: one round.

    Like a checkpoint: one dd per rank at once (`streams`, the bytes split evenly), into new files,
    after a pause, with conv=fsync (our writer fsyncs every shard). The pause matters on this VM:
    its balloon driver hands free pages back to the host ~2 s after they are freed, and writing
    into such a page costs a host fault (measured here: 2.4 GB/s into pages freed just before,
    740 MB/s six seconds later). A save after minutes of training writes into such pages.
    """
    time.sleep(PAUSE_S)
    targets = [directory / f"dd_{k}.bin" for k in range(streams)]
    started = time.perf_counter()
    procs = [_dd(target, max(1, megabytes // streams), direct) for target in targets]
    for proc in procs:
        _check(proc)
    seconds = time.perf_counter() - started
    for target in targets:
        target.unlink(missing_ok=True)
    return megabytes / seconds


def _dd(target: Path, megabytes: int, direct: bool = False) -> subprocess.Popen[str]:
    # direct: around the page cache in 16 MiB blocks, as the writer's O_DIRECT path writes
    if direct:
        size = ["bs=16M", f"count={max(1, megabytes // 16)}", "oflag=direct"]
    else:
        size = ["bs=1M", f"count={megabytes}"]
    return subprocess.Popen(
        ["dd", "if=/dev/zero", f"of={target}", *size, "conv=fsync"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"dd failed: {err.strip()}")


def train(workdir: Path, model: str, mode: str, steps: int, every: int) -> Path:
    """mode: sync (pauses at `steps`), async, or load (the paused sync run, started again)."""
    args = [
        sys.executable,
        "-m",
        "slurmtrain",
        "cluster=local",
        f"model={model}",
        f"train.max_steps={steps + 1}",
        f"train.pause_at_step={steps}",
        "train.log_interval=1",
        f"checkpoint.interval_steps={every}",
        "checkpoint.keep_last=2",
        f"checkpoint.async_save={'true' if mode == 'async' else 'false'}",
        f"name=io-{model}-{'async' if mode == 'async' else 'sync'}",
        f"runs_root={workdir}",
        *BATCH,
        *MODEL_ARGS.get(model, []),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True)
    [run] = (workdir / f"io-{model}-{'async' if mode == 'async' else 'sync'}").glob("*/config.yaml")
    paused = mode != "load" and bool(_of(run.parent, events.Paused))  # a paused run exits 1
    if done.returncode and not paused:
        raise SystemExit(f"slurmtrain failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return run.parent


def _of(run: Path, kind: type[R]) -> list[R]:
    """The run's ledger rows of one kind."""
    from slurmtrain.common.rundir import RunDir

    return [e for e in RunDir(run).events() if isinstance(e, kind)]


def evict(directory: Path) -> None:
    """Drop this checkpoint's pages from the page cache (they are clean: fsynced by the save)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def newest(run: Path) -> Path:
    from slurmtrain.common import checkpoint_format

    found = checkpoint_format.find_resumable(run / "checkpoints", full=False)
    assert found.path is not None, f"no checkpoint in {run}"
    return found.path


class LoadFigures(TypedDict):
    seconds: float
    mb: float


class SaveFigures(TypedDict):
    """The saves of one run, from its `checkpoint_saved` rows (medians unless said)."""

    saves: int
    mb: float
    blocked: float  # seconds the loop waited, with the next step's wait for the host copy
    blocked_later: float  # the same without the first save (async: it allocates the host pool)
    blocked_max: float
    total: float  # seconds until published
    parts: dict[str, float]  # the writer's phases (write_seconds)


def load_figures(run: Path) -> LoadFigures:
    loaded = max(_of(run, events.CheckpointLoaded), key=lambda e: e.seconds or 0.0)
    path = Path(loaded.path or "")
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return {"seconds": loaded.seconds or 0.0, "mb": size / 1e6}


def universal_seconds(run: Path) -> float:
    from slurmtrain.common import checkpoint_format
    from slurmtrain.compute.checkpoint import reshape

    found = checkpoint_format.find_resumable(run / "checkpoints", full=False)
    assert found.path is not None, f"no checkpoint in {run}"
    return reshape.convert(found.path, found.manifest).seconds


def _part(save: events.CheckpointSaved, key: str) -> float:
    """One phase of a save's writer (its `write_seconds`), 0 when absent."""
    value = (save.write_seconds or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else 0.0


def figures(run: Path) -> SaveFigures:
    saves = _of(run, events.CheckpointSaved)
    mb = statistics.median(e.bytes or 0 for e in saves) / 1e6
    parts = {
        k: round(statistics.median(_part(e, k) for e in saves), 2)
        for k in ("serialize", "write", "disk_wait", "hash", "fsync", "copy", "step_wait")
    }
    later = saves[1:] or saves  # the first async save allocates the host pool (page faults)

    def stall(e: events.CheckpointSaved) -> float:  # + the next step's wait for the host copy
        return (e.seconds or 0.0) + _part(e, "step_wait")

    return {
        "saves": len(saves),
        "mb": mb,
        "blocked": statistics.median(stall(e) for e in saves),
        "blocked_later": statistics.median(stall(e) for e in later),
        "blocked_max": max(stall(e) for e in saves),
        "total": statistics.median(e.total_seconds or 0.0 for e in saves),
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
    parser.add_argument("--models", default="opt125m,opt1.3b")
    parser.add_argument(
        "--phases",
        default="sync",
        help="runs after the sync one (always run): async saves, the cold load, and `universal` "
        "(the DeepSpeed universal conversion); `--phases sync` for the save/dd ratio alone",
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--every", type=int, default=2, help="checkpoint.interval_steps")
    parser.add_argument("--dd-rounds", type=int, default=2, help="dd runs at each of 5 points")
    parser.add_argument(
        "--dd-mb",
        type=int,
        default=1000,
        help="dd's bytes before a model's sync run (not in DD_MB)",
    )
    opts = parser.parse_args()
    phases = set(opts.phases.split(","))
    base = opts.dir or Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    out = []
    with tempfile.TemporaryDirectory(dir=base, prefix="ckpt-io-") as tmp:
        workdir = Path(tmp)
        for model in opts.models.split(","):
            out.append(bench_model(workdir, model, phases, opts))
    report(out, base, opts)


def bench_model(workdir: Path, model: str, phases: set[str], opts: Any) -> dict[str, Any]:
    """One model's runs, with dd rounds between them (into the directory the saves went to)."""
    rounds, guess = opts.dd_rounds, DD_MB.get(model, opts.dd_mb)
    dd = [dd_mb_s(workdir, guess) for _ in range(rounds)]  # just before the saves
    sync_run = train(workdir, model, "sync", opts.steps, opts.every)
    sync = figures(sync_run)
    size, where = max(1, round(sync["mb"])), sync_run / "checkpoints"
    dd += [dd_mb_s(where, size) for _ in range(rounds)]  # just after them
    result = {"model": model, "sync": sync, "size": size, "guess": guess}
    result["dd_judged"] = dd[:]  # the runs on either side of the sync saves
    # the same bytes written around the page cache: the disk's own speed, as the writer meets it
    result["dd_direct"] = [dd_mb_s(where, size, direct=True) for _ in range(rounds)]
    if "async" in phases:
        result["async"] = figures(train(workdir, model, "async", opts.steps, opts.every))
        dd += [dd_mb_s(where, size) for _ in range(rounds)]
    if "load" in phases:
        evict(newest(sync_run))
        result["load"] = load_figures(train(workdir, model, "load", opts.steps, opts.every))
        dd += [dd_mb_s(where, size) for _ in range(rounds)]
    if "universal" in phases:
        result["universal"] = universal_seconds(sync_run)
    result["dd"] = dd
    return result


def report(out: list[dict[str, Any]], base: Path, opts: Any) -> None:
    print(
        f"checkpoint I/O on {base} (cluster=local, 2 CPU ranks, fp32, ZeRO-2; medians over the "
        f"saves of {opts.steps} steps, one every {opts.every}; dd: {opts.dd_rounds} runs before "
        f"and after each training run)"
    )
    head = (
        f"{'model':8} {'bytes':>13} {'sync save s':>11} {'MB/s':>7} {'dd MB/s':>8} "
        f"{'ratio':>6} {'dd spread':>9} {'dd direct':>9} {'ratio':>6} {'spread':>6} "
        f"{'async stall s':>13} {'stall/sync':>10} "
        f"{'load s':>7} {'load MB/s':>9}"
    )
    print(head)
    print("-" * len(head))
    judged = True
    for r in out:
        sync, dd = r["sync"], r["dd_judged"]
        mb_s, ref = sync["mb"] / sync["total"], statistics.median(dd)
        spread = (max(dd) - min(dd)) / ref
        direct = statistics.median(r["dd_direct"])
        d_spread = (max(r["dd_direct"]) - min(r["dd_direct"])) / direct
        # judged when either reference held still: the direct one is the disk without the VM's
        # page-cache effects (buffered dd alternates with the balloon driver, see dd_mb_s)
        judged &= min(spread, d_spread) <= SPREAD_LIMIT
        stall = r["async"]["blocked_later"] if "async" in r else None
        load = r.get("load")
        print(
            f"{r['model']:8} {round(sync['mb'] * 1e6):>13,} {sync['total']:>11.3f} {mb_s:>7.1f} "
            f"{ref:>8.1f} {mb_s / ref:>6.2f} {spread:>8.0%}{'!' if spread > SPREAD_LIMIT else ' '} "
            f"{direct:>9.1f} {mb_s / direct:>6.2f} {d_spread:>5.0%}{'!' if d_spread > SPREAD_LIMIT else ' '} "
            + (
                f"{stall:>13.3f} {stall / sync['total']:>10.3f} "
                if stall is not None
                else f"{'-':>13} {'-':>10} "
            )
            + (
                f"{load['seconds']:>7.3f} {load['mb'] / load['seconds']:>9.1f}"
                if load
                else f"{'-':>7} {'-':>9}"
            )
        )
    print()
    for r in out:
        sync = r["sync"]
        line = (
            f"{r['model']}: dd runs MB/s {[round(x) for x in r['dd']]} (the first "
            f"{opts.dd_rounds} of {r['guess']} MB, the rest of {r['size']} MB); sync saves "
            f"{sync['saves']}, slowest rank's seconds {sync['parts']}"
        )
        line += f"; dd direct runs MB/s {[round(x) for x in r['dd_direct']]}"
        if "async" in r:
            a = r["async"]
            line += (
                f"; async stall all saves {a['blocked']:.3f} s (first allocates the host pool; "
                f"max {a['blocked_max']:.3f} s), until published {a['total']:.3f} s"
            )
        if "load" in r:
            line += f"; loaded {r['load']['mb']:.0f} MB (cold)"
        if "universal" in r:
            line += f"; universal conversion {r['universal']:.1f} s"
        print(line)
        if r["model"] in SLICES:
            print(f"  {r['model']} here is {SLICES[r['model']]}")
    if not judged:
        print(
            f"! dd spread above {SPREAD_LIMIT:.0%}: the disk or CPUs were busy with something else; "
            f"the ratios are not a judgement of the writer (run it again on an idle machine)"
        )
    print(
        "sync save s: median time a synchronous save blocked the loop (= until published); MB/s: "
        "bytes / that;\ndd MB/s: as many bytes with conv=fsync, one dd per rank at once, new files "
        "in the run's checkpoints/ (before the run: its parent), after a 5 s pause; ratio: MB/s / "
        "dd; dd spread: (max - min) / median;\ndd direct: the same with oflag=direct bs=16M after "
        "the sync run (around the page cache, as the writer's O_DIRECT path), its ratio and spread;\n"
        "dd MB/s and spread: the dd runs just before and after the sync run;\nasync stall s: "
        "median time an async save blocked the loop (waiting for the previous save, laying out "
        "the host copy) + the next optimizer step's wait for the copy (write_seconds.step_wait), "
        "saves after the first;\nload s: the resumed run's checkpoint_loaded (its files evicted "
        "from the page cache before)"
    )


if __name__ == "__main__":
    main()
