"""GPU throughput: slurmtrain's real entrypoint beside a really bare DeepSpeed loop, same shapes.

    python bench/gpu_throughput.py [--models opt1.3b,opt2.7b] [--micro-batch opt1.3b=8,opt2.7b=2]
                                   [--card-gib 79.1]

One GPU, bf16, seq 2048, ZeRO-2, synthetic data, the runs bench/gpu_check_plan.py defines (eval
off, dropout off). Ours is `python -m slurmtrain ... gpus_per_node=1` (local executor: one task),
timed over its steady window: from the metrics row of step WARMUP to the row of the last step
(no evaluation, no save inside). The bare loop (bench/bare_deepspeed_loop.py: transformers' OPT and
loss, its own DeepSpeed config, DeepSpeed's own loop) times the same steps of the same shapes with
the device synchronised at both ends. Tokens/s, TFLOPS and MFU (planning/flops.py, model FLOPs)
over the window, side by side; writes bench/results/<date>-<device>.json. Every process runs under
a timeout that kills its whole process group. Also the helpers bench/gpu_check.py runs them with.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check_plan as plan  # noqa: E402  (bench/ is not a package)


class RunFailed(RuntimeError):
    """A process of the check failed or ran past its timeout; the message ends with its output."""


def spawn(
    cmd: Sequence[str], timeout: float, cwd: Path, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in its own session; past `timeout` the whole group is killed (submitit's
    controller and the training task with it), and RunFailed says so with the output's tail."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers too (the group outlives its lead)
            except ProcessLookupError:
                pass
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code is None:
        raise RunFailed(
            f"{' '.join(cmd[:4])}...: killed at its {timeout:.0f} s timeout\n{stderr[-1500:]}"
        )
    return subprocess.CompletedProcess(list(cmd), code, stdout, stderr)


def run_slurmtrain(
    overrides: Sequence[str], work: Path, timeout: float, pausing: bool = False
) -> Path:
    """`python -m slurmtrain cluster=local runs_root=WORK ...`: the run directory it trained."""
    from slurmtrain.common import events
    from slurmtrain.common.rundir import RunDir

    name = next(a.split("=", 1)[1] for a in overrides if a.startswith("name="))
    cmd = [sys.executable, "-m", "slurmtrain", "cluster=local", f"runs_root={work}", *overrides]
    done = spawn(cmd, timeout, cwd=work)
    found = sorted(work.glob(f"{name}/*/config.yaml"), key=os.path.getmtime)
    run = found[-1].parent if found else None
    paused = run is not None and any(isinstance(e, events.Paused) for e in RunDir(run).events())
    if run is None or (done.returncode and not (pausing and paused)):
        tail = (done.stdout + done.stderr)[-2000:]
        raise RunFailed(f"{name}: python -m slurmtrain exit {done.returncode}:\n{tail}")
    return run


def flops_per_token(model: str, seq: int, layers: Optional[int] = None) -> float:
    from slurmtrain.planning import flops

    return flops.flops_per_token(model_shape(model, layers), seq)


def model_shape(model: str, layers: Optional[int] = None) -> Any:
    """conf/model/MODEL.yaml as the schema's ModelConfig (num_layers replaced when given)."""
    from omegaconf import OmegaConf

    from slurmtrain.common.schema import ModelConfig

    spec = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{model}.yaml"))
    assert isinstance(spec, dict)
    if layers:
        spec["num_layers"] = layers
    return ModelConfig(**{str(k): v for k, v in spec.items()})


def figures(tokens_per_s: float, fpt: float, device: str, dtype: str) -> dict[str, Any]:
    """tokens/s, TFLOPS and MFU (None without a known peak: CPUs) of one rate."""
    from slurmtrain.planning import flops

    return {
        "tokens_per_s": tokens_per_s,
        "tflops": flops.tflops_per_gpu(tokens_per_s, fpt),
        "mfu": flops.mfu(tokens_per_s, fpt, device_name=device, dtype=dtype),
    }


def window(run: Path, first: int, last: int, tokens_per_step: int) -> dict[str, Any]:
    """Ours over its steady window: the metrics rows of steps `first` and `last` bound it; a row
    holding an evaluation inside it is refused (its time is no training step's)."""
    from metric_fields import integer, number

    from slurmtrain.common.jsonl import read_jsonl

    rows = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        step = integer(r, "step")
        if step is None or not first <= step <= last:
            continue
        if any(str(k).startswith("valid") for k in r) and step > first:
            raise RunFailed(f"{run.name}: an evaluation at step {step}, inside the timed window")
        rows[step] = r
    if first not in rows or last not in rows:
        raise RunFailed(f"{run.name}: no metrics rows for steps {first} and {last}: {sorted(rows)}")
    seconds = number(rows[last], "time") - number(rows[first], "time")
    peak = rows[last].get("peak_mem_bytes_max")
    return {
        "tokens_per_s": (last - first) * tokens_per_step / seconds,
        "seconds_timed": seconds,
        "steps_timed": last - first,
        "peak_mem_bytes": peak,
    }


def run_bare(
    model: str,
    micro: int,
    mode: plan.Mode,
    timeout: float,
    work: Path,
    layers: Optional[int] = None,
) -> dict[str, Any]:
    """bench/bare_deepspeed_loop.py as rank 0 of 1, the shapes of conf/model/MODEL.yaml."""
    from slurmtrain.login.local_submit import free_port

    shape = model_shape(model, layers)
    keys = ("num_layers", "hidden_size", "num_heads", "ffn_dim", "vocab_size", "max_positions")
    spec = {k: getattr(shape, k) for k in keys}
    spec["word_embed_proj_dim"] = shape.word_embed_proj_dim
    spec["layer_norm_before"] = shape.layer_norm_before
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PYTHONWARNINGS="ignore",
    )
    if mode.name == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    else:
        env.pop("DS_ACCELERATOR", None)
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "bare_deepspeed_loop.py"),
        json.dumps(spec),
        f"--micro={micro}",
        f"--seq={mode.seq}",
        f"--warmup={mode.warmup}",
        f"--steps={mode.steps}",
        f"--dtype={mode.dtype}",
    ]
    done = spawn(cmd, timeout, cwd=work, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RunFailed(f"bare {model}: exit {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _within(run: plan.Run, deadline: float) -> float:
    """The run's timeout, cut to what is left before `deadline`; refused when little is."""
    left = deadline - time.monotonic()
    if left < 5:
        raise RunFailed(f"{run.label}: not started, the check's time is spent")
    return min(run.timeout_s, left)


def require_gpu() -> str:
    """The CUDA device name, or exit 2 with one line saying why there is none."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        smi = "nvidia-smi found" if shutil.which("nvidia-smi") else "no nvidia-smi"
        print(
            f"bench/gpu_throughput.py: no CUDA GPU visible (torch {torch.__version__}, {smi}); "
            f"run it on a GPU machine",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return str(torch.cuda.get_device_name(0))


def compare(
    mode: plan.Mode,
    runs: list[plan.Run],
    work: Path,
    device: str,
    deadline: float,
    what: str,
) -> dict[str, Any]:
    """One throughput row: ours (runs[0]) and its bare twin (runs[1], if any), judged against
    gpu_check_plan's floors (the row's `missed` lists what fell short; `ok` when nothing did)."""
    ours_run, *twin = runs
    layers = next((int(a.split("=")[1]) for a in ours_run.overrides if "num_layers=" in a), None)
    fpt = flops_per_token(ours_run.model, mode.seq, layers)
    tokens = ours_run.micro * mode.seq
    total = mode.warmup + mode.steps
    run = run_slurmtrain(ours_run.overrides, work, _within(ours_run, deadline))
    ours = window(run, mode.warmup, total, tokens)
    ours.update(figures(ours["tokens_per_s"], fpt, device, mode.dtype))
    row: dict[str, Any] = {"model": ours_run.model, "micro": ours_run.micro, "seq": mode.seq}
    if layers:  # a slice: the model's layer shapes, fewer of them (planning/mfu.py reads `model`)
        row["layers"] = layers
    row["ours"] = ours
    from slurmtrain.planning import flops

    floors: dict[str, Optional[float]] = {
        "mfu": plan.mfu_floor(flops.peak_key(device), what),
        "ours_over_bare": plan.RATIO_FLOOR[mode.name],
    }
    if twin:
        model, timeout = ours_run.model, _within(twin[0], deadline)
        bare = run_bare(model, ours_run.micro, mode, timeout, work, layers)
        bare.update(figures(bare["tokens_per_s"], fpt, device, mode.dtype))
        row["bare"] = bare
        row["ours_over_bare"] = ours["tokens_per_s"] / bare["tokens_per_s"]
    else:
        floors.pop("ours_over_bare")
    missed = plan.judge({"mfu": ours["mfu"], **row}, floors)
    row["thresholds"] = {
        k: (f">= {v:g}" if v is not None else "not judged") for k, v in floors.items()
    }
    row["missed"] = missed
    row["ok"] = not missed
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="opt1.3b")
    p.add_argument("--micro-batch", default="", help="MODEL=N,... (default: gpu_check_plan's)")
    p.add_argument("--card-gib", type=float, default=None, help="default: mem_get_info's total")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default bench/results/)")
    args = p.parse_args()
    device = require_gpu()
    import torch

    gib = args.card_gib or plan.card_gib(torch.cuda.mem_get_info()[1])
    micro = dict(plan.GPU.throughput + plan.GPU.extras)
    for item in filter(None, args.micro_batch.split(",")):
        name, _, value = item.partition("=")
        micro[name] = int(value)
    results = []
    with tempfile.TemporaryDirectory(prefix="gpubench-") as tmp:
        for m in filter(None, args.models.split(",")):
            runs = plan.throughput_runs(plan.GPU, m, micro.get(m, 4), m)
            runs = [replace(r, overrides=tuple(plan.with_card(r.overrides, gib))) for r in runs]
            row = compare(plan.GPU, runs, Path(tmp), device, time.monotonic() + 600, m)
            results.append(row)
            print(json.dumps(row, default=str), flush=True)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    out = args.out or ROOT / "bench" / "results" / f"{dt.date.today().isoformat()}-{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": device,
        "card_gib": gib,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    out.write_text(json.dumps({**meta, "results": results}, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
