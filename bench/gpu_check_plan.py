"""What bench/gpu_check.py starts, in what order, with what timeout, and what each row must show.

Pure (no torch): `bench/gpu_check.py --dry` prints this plan with the planner's verdict on each run
for a card's memory, and the tests read it without a GPU.

Order: the most important rows first, so a lease cut short still answers them: (1) `n1`, an async
save's fp32 partition byte for byte against what DeepSpeed held at that step; (2) ZeRO-2 bf16
throughput and MFU against a bare transformers + DeepSpeed loop; (3) resume; then the rest. Every
run has a timeout the check enforces (the whole process group is killed), and on a GPU the
timeouts add up to at most GPU_BUDGET_S: with the wheels' set-up the check fits 8 minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

GiB = 2**30
GPU_BUDGET_S = 450  # the GPU plan's timeouts together
# ours / bare tokens/s. CPU: not judged (on two shared cores the two runs see other loads: 0.16 to
# 1.6 were seen for the same code here), the rows still show both rates
RATIO_FLOOR: dict[str, Optional[float]] = {"gpu": 0.97, "cpu": None}

# MFU floors for slurmtrain's own run (model FLOPs over the steady window, the dense bf16 peak of
# planning/flops.py), by the card's flops.peak_key and the run (bf16, ZeRO-2, seq 2048, one GPU).
# A guess, not a measurement: below the planner's own MFU estimate for these cards and sizes (its
# table: 35% for 1-3B under ZeRO-0-2 on H100-class cards), so it catches a broken path (unfused
# attention, a device sync per micro step, fp32 matmuls) rather than grading tuning; the first GPU
# check's figures should replace it. A card or run not listed is not judged on MFU (CPUs).
MFU_FLOORS: dict[str, dict[str, float]] = {
    "H100-SXM": {"opt1.3b": 0.30, "opt2.7b": 0.30, "slice13b": 0.30},
    "H200": {"opt1.3b": 0.30, "opt2.7b": 0.30, "slice13b": 0.30},
    "GH200": {"opt1.3b": 0.30, "opt2.7b": 0.30, "slice13b": 0.30},
    "A100": {"opt1.3b": 0.30, "opt2.7b": 0.30, "slice13b": 0.30},
}


def mfu_floor(card_key: Optional[str], what: str) -> Optional[float]:
    """The MFU a run must reach on this card (flops.peak_key of its name), or None: not judged."""
    return MFU_FLOORS.get(card_key or "", {}).get(what)


@dataclass(frozen=True)
class Run:
    """One process the check starts: `kind` says which (device probe, N1 check, slurmtrain, bare)."""

    label: str  # unique in the plan
    check: str  # the row it feeds
    kind: str  # "device" | "n1" | "slurmtrain" | "bare"
    timeout_s: int
    model: str = ""
    micro: int = 0
    overrides: tuple[str, ...] = ()  # slurmtrain's (kinds n1 and slurmtrain; bare: its twin's)

    @property
    def planned(self) -> bool:
        """Asked of slurmtrain's planner (a bare run: the shapes of its slurmtrain twin)."""
        return self.kind in ("n1", "slurmtrain", "bare")


@dataclass(frozen=True)
class Mode:
    """The shapes and step counts of one mode ("gpu": seq 2048 bf16; "cpu": opt_tiny)."""

    name: str
    seq: int
    dtype: str
    base: tuple[str, ...]
    throughput: tuple[tuple[str, int], ...]  # (model, micro batch): ZeRO-2 throughput vs bare
    small: tuple[str, int]  # the N1, resume and precision runs' model and micro batch
    warmup: int  # throughput: steps before the timed window
    steps: int  # throughput: timed steps
    log: int  # throughput: metrics row every `log` steps (the window's ends are rows)
    resume_n: int  # the resume check pauses at n and trains to 2n
    n1_save: int  # the N1 check saves at this step and trains two more
    gemm: tuple[int, str]
    timeouts: dict[str, int]
    budget_s: int
    slice: tuple[str, int, int] = ("opt13b", 2, 4)  # extras: model, micro batch, layers
    extras: tuple[tuple[str, int], ...] = (("opt2.7b", 2),)  # extras: more throughput models


GPU = Mode(
    name="gpu",
    seq=2048,
    dtype="bf16",
    base=("gpus_per_node=1", "data=synthetic", "deepspeed=zero2", "deepspeed.dtype=bf16"),
    # opt1.3b at micro batch 8 plans 62 GiB: fits an 80 GB card's 79.2 GiB with 17 GiB to spare
    throughput=(("opt1.3b", 8),),
    small=("opt125m", 8),
    warmup=10,
    steps=20,
    log=5,
    resume_n=8,
    n1_save=4,
    gemm=(8192, "bfloat16"),
    # seconds: the device probe; the N1 run (one process, login and compute in it); a slurmtrain
    # throughput run and its bare twin; each of the four resume runs and the fp32 run (opt125m)
    timeouts={"device": 30, "n1": 75, "ours": 80, "bare": 60, "small": 40, "extra": 80},
    budget_s=GPU_BUDGET_S,
)
CPU = Mode(
    name="cpu",
    seq=128,
    dtype="fp32",
    base=("gpus_per_node=0", "cluster.cpu_tasks_per_node=1", "data=synthetic", "deepspeed=zero2"),
    throughput=(("opt_tiny", 4),),
    small=("opt_tiny", 4),
    warmup=5,
    steps=20,
    log=5,
    resume_n=3,
    n1_save=3,
    gemm=(512, "float32"),
    timeouts={"device": 120, "n1": 180, "ours": 180, "bare": 120, "small": 150, "extra": 180},
    budget_s=1500,
    slice=("opt_tiny", 4, 1),
    extras=(),
)


def common(mode: Mode, model: str, micro: int, steps: int, name: str) -> list[str]:
    """Every run's overrides: eval off (the timing windows never hold an evaluation), no saves
    unless a check asks, dropout off, a short warm-up so a few steps move the weights."""
    return [
        *mode.base,
        f"model={model}",
        f"data.seq_len={mode.seq}",
        f"train.micro_batch_size={micro}",
        f"train.global_batch_size={micro}",
        f"train.max_steps={steps}",
        "train.log_interval=1",
        "train.eval_interval=0",
        "model.dropout=0",
        "optim.warmup_steps=2",
        "checkpoint.interval_steps=0",
        "checkpoint.final_save=false",
        f"name={name}",
    ]


def override(args: list[str], key: str, value: object) -> list[str]:
    """`args` with KEY=VALUE in place of any KEY=... (Hydra refuses a key given twice)."""
    return [a for a in args if not a.startswith(f"{key}=")] + [f"{key}={value}"]


def slug(model: str) -> str:
    return model.replace(".", "_")


def throughput_runs(
    mode: Mode, model: str, micro: int, what: str, extra: str = "", more: bool = False
) -> list[Run]:
    """slurmtrain's run and its bare twin (same shapes, micro batch, steps); `what` names them."""
    total = mode.warmup + mode.steps
    args = common(mode, model, micro, total, f"tp-{slug(what)}")
    args = override(args, "train.log_interval", mode.log) + ([extra] if extra else [])
    t = mode.timeouts
    ours = t["extra"] if more else t["ours"]
    return [
        Run(f"tp-{what}", "throughput", "slurmtrain", ours, model, micro, tuple(args)),
        Run(f"tp-{what}-bare", "throughput", "bare", t["bare"], model, micro, tuple(args)),
    ]


def plan(mode: Mode, extras: bool = False) -> list[Run]:
    """Every run of the check, most important first."""
    t, (small, micro) = mode.timeouts, mode.small
    # bf16 also on CPUs (the precision check compares it with fp32); async saves as on GPUs
    n1_steps = mode.n1_save + 2  # two steps past the save, and no second save
    n1_args = override(common(mode, small, micro, n1_steps, "n1"), "deepspeed.dtype", "bf16")
    n1_args = override(n1_args, "checkpoint.interval_steps", mode.n1_save)
    n1_args = override(n1_args, "checkpoint.async_save", "true")
    n = mode.resume_n
    whole = override(common(mode, small, micro, 2 * n, "whole1"), "deepspeed.dtype", "bf16")
    cut = override(whole, "checkpoint.final_save", "true")
    cut = override(override(cut, "checkpoint.async_save", "true"), "train.pause_at_step", n)
    cut = override(cut, "name", "cut")
    runs = [
        Run("device", "device", "device", t["device"]),
        Run("n1", "n1", "n1", t["n1"], small, micro, tuple(n1_args)),
    ]
    for model, mb in mode.throughput:
        runs += throughput_runs(mode, model, mb, model)
    runs += [
        Run("resume-whole1", "resume", "slurmtrain", t["small"], small, micro, tuple(whole)),
        Run("resume-cut", "resume", "slurmtrain", t["small"], small, micro, tuple(cut)),
        Run("resume-cont", "resume", "slurmtrain", t["small"], small, micro, tuple(cut)),
        Run(
            "resume-whole2",
            "resume",
            "slurmtrain",
            t["small"],
            small,
            micro,
            tuple(override(whole, "name", "whole2")),
        ),
        Run(
            "precision-fp32",
            "bf16_vs_fp32",
            "slurmtrain",
            t["small"],
            small,
            micro,
            tuple(override(override(whole, "deepspeed.dtype", "fp32"), "name", "fp32")),
        ),
    ]
    if extras:  # beyond the 8-minute plan: --extras (a longer lease)
        for model, mb in mode.extras:
            runs += throughput_runs(mode, model, mb, model, more=True)
        model, mb, layers = mode.slice
        extra = f"model.num_layers={layers}"
        runs += throughput_runs(mode, model, mb, "slice13b", extra, more=True)[:1]
    return runs


def card_gib(total_bytes: int) -> float:
    """A card's memory as `cluster.gpu_mem_gb` takes it (GiB), rounded down to 0.1."""
    return math.floor(total_bytes / GiB * 10) / 10


def with_card(overrides: tuple[str, ...], gib: Optional[float]) -> list[str]:
    """The run's overrides with the card's memory (torch.cuda.mem_get_info's total)."""
    return [*overrides, f"cluster.gpu_mem_gb={gib:g}"] if gib else list(overrides)


def judge(figures: dict[str, Optional[float]], floors: dict[str, Optional[float]]) -> list[str]:
    """The floors a row's figures miss (a missing figure misses its floor); None floors: not judged."""
    missed = []
    for key, floor in floors.items():
        value = figures.get(key)
        if floor is not None and (value is None or value < floor):
            shown = "none" if value is None else f"{value:.3f}"
            missed.append(f"{key} {shown} < {floor:g}")
    return missed


@dataclass(frozen=True)
class Verdict:
    """The planner's answer for one run: fits or not, and its memory line (or refusal) in brief."""

    fits: bool
    text: str


def planner(runs: list[Run], gib: Optional[float], runs_root: str) -> dict[str, Verdict]:
    """What `python -m slurmtrain cluster=local ... cluster.gpu_mem_gb=GIB dry_run=true` says of
    each planned run (the same resolve and preflight, in this process: ~0.1 s a run)."""
    import os
    import re

    os.environ.setdefault("SLURMTRAIN_AUTO", "off")
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema
    from slurmtrain.login.composed import typed
    from slurmtrain.login.prepare import resolve
    from slurmtrain.planning import preflight

    schema.register()
    out: dict[str, Verdict] = {}
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        for run in runs:
            if not run.planned:
                continue
            args = ["cluster=local", f"runs_root={runs_root}", *with_card(run.overrides, gib)]
            try:
                cfg = resolve(compose("config", overrides=args))
                report = preflight.report(typed(cfg), measured_tps=None)
            except Exception as err:  # noqa: BLE001  a refusal of any kind is this run's answer
                out[run.label] = Verdict(False, f"refused: {type(err).__name__}: {err}")
                continue
            if report.misfit:
                out[run.label] = Verdict(False, f"refused: {report.misfit}")
                continue
            line = next((x for x in report.lines if x.startswith("plan: memory/")), "")
            found = re.search(r"memory/GPU ([\d.]+) GiB of ([\d.]+) GiB", line)
            if found and float(found[2]) > 0:
                used, card = float(found[1]), float(found[2])
                text = f"fits: {used:.1f} of {card:g} GiB ({used / card:.0%})"
            else:
                text = "fits" + (f" ({line.removeprefix('plan: ')[:60]})" if line else "")
            out[run.label] = Verdict(True, text)
    return out
