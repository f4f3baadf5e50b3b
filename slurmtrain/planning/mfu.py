"""The MFU an ETA assumes before the run measured its own throughput, and where it comes from.

In order: `mfu_guess=N` set by hand; the GPU check's measurement (`mfu_measured=FILE`, the JSON
lines bench/gpu_check.py writes) for the plan's card, ZeRO stage group and size band; else the
table below, keyed by card family, ZeRO stage group, size band and tensor-parallel degree
(parallel.tensor; TP > 1 has its own rows above 30B and 5 points less below). The plan prints one
line with the figure and its source, always labelled an estimate until the run measures its own.

Seeded from published bf16 figures at seq 2048 (MFU = 6N + attention FLOPs over the dense peak,
as planning/flops.py counts):
- MosaicML llm-foundry, scripts/train/benchmarking/README.md (PyTorch FSDP FULL_SHARD, i.e.
  ZeRO-3-like, H100 80GB): 760M-1B on 8-64 GPUs 35-42%; 3B on 64 GPUs 40.8%; 7B on 8 GPUs
  46.4%; 13B on 8-64 GPUs 39.6-40.0%; 30B on 16-32 GPUs 43-44%; 70B on 32 GPUs 36.2% (micro
  batch 2), on 64 GPUs 42.6% (micro batch 8, full activation checkpointing). A100 80GB (1600 Gbps
  RoCE): 13B-30B on 8 GPUs 54-56%, 70B on 64 GPUs 53.3%.
- torchtitan/docs/performance.md: Llama 3.1 8B FSDP on 8-128 H100s 33-39%; Llama 3 8B FSDP on
  64 A100s 56-58%, 70B 50.5-51.7%; Llama 3.1 405B FSDP + TP on 128 H100s 29.0%.
These are tuned stacks (fused kernels, flash attention); the table takes their lower end. Judgement,
not published: DeepSpeed's ZeRO-3 (parameters fetched module by module through hooks) 5 points
below; cards without a published figure get a generic 35% (30% above 30B).

Above ~30B parameters without tensor parallelism every step all-gathers the parameters (ZeRO-3)
and reduces the gradients over data parallelism alone, while the micro batch that fits (the
compute that hides them) shrinks: the table expects less there, and the plan says so.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Optional

from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.planning import cards
from slurmtrain.planning.shapes import OPT_SIZES, param_count, params_of

AUTO = "auto"
BIG = 30e9  # parameters above which data parallelism alone is expected to fall behind
BANDS = ((3e9, "<3B"), (10e9, "3-10B"), (BIG, "10-30B"), (math.inf, ">30B"))
FAMILIES = {
    "hopper": ("H100-SXM", "H100-PCIe", "H100-NVL", "H200", "H200-NVL", "GH200", "H800"),
    "ampere": ("A100", "A800"),
}
ZERO3_PENALTY = 0.05  # judgement (module docstring)

# (family, band) -> (MFU at ZeRO 0-2, TP=1; its source in a few words)
_SEED: dict[tuple[str, str], tuple[float, str]] = {
    ("hopper", "<3B"): (0.35, "MosaicML 760M-1B on 8-64 H100s: 35-42%"),
    ("hopper", "3-10B"): (0.38, "torchtitan 8B on 8-128 H100s 33-39%, MosaicML 3-7B 41-46%"),
    ("hopper", "10-30B"): (0.40, "MosaicML 13B on 8-64 H100s: 40%"),
    ("hopper", ">30B"): (0.30, "MosaicML 70B on 32-64 H100s 36-43%, torchtitan 405B 29%"),
    ("ampere", "<3B"): (0.40, "no A100 figure below 3B: judgement"),
    ("ampere", "3-10B"): (0.50, "torchtitan 8B on 64 A100s: 56-58%"),
    ("ampere", "10-30B"): (0.50, "MosaicML 13-30B on 8 A100s: 54-56%"),
    ("ampere", ">30B"): (0.45, "MosaicML 70B on 64 A100s 53%, torchtitan 70B 51%"),
}
# TP > 1 (DeepSpeed AutoTP within a node): above 30B, published TP=8 figures less what AutoTP does
# not do (overlap its all-reduces with compute, sequence parallelism): judgement on a source.
_TP_SEED: dict[tuple[str, str], tuple[float, str]] = {
    ("hopper", ">30B"): (
        0.35,
        "Llama 3 405B with TP 8 on 16k H100s: 38-43% (Dubey et al. 2024, its all-reduces "
        "overlapped); AutoTP does not overlap them: a few points less",
    ),
    ("ampere", ">30B"): (
        0.45,
        "Megatron-LM 145B-1T with TP 8 on A100s: 47-52% (Narayanan et al. 2021, overlapped); "
        "AutoTP does not overlap its all-reduces: a few points less",
    ),
}
TP_PENALTY = (
    0.05  # below 30B: TP's all-reduces, not hidden, on a model DP alone would run (judgement)
)
GENERIC, GENERIC_BIG = 0.35, 0.30  # cards without a published figure (judgement)


def family(card_key: Optional[str]) -> str:
    return next((f for f, keys in FAMILIES.items() if card_key in keys), "other")


def band(params: float) -> str:
    return next(name for limit, name in BANDS if params <= limit)


def stage_group(stage: int) -> str:
    return "ZeRO-3" if stage == 3 else "ZeRO-0-2"


def table(card_key: Optional[str], stage: int, params: float, tp: int = 1) -> tuple[float, str]:
    """The table's MFU and source for (card, ZeRO stage, size band, TP degree)."""
    fam, size = family(card_key), band(params)
    generic = GENERIC_BIG if size == ">30B" else GENERIC
    value, why = _SEED.get((fam, size), (generic, f"no published figure for {card_key or 'it'}"))
    if tp > 1 and (fam, size) in _TP_SEED:
        value, why = _TP_SEED[(fam, size)]
    elif tp > 1:
        value, why = (
            value - TP_PENALTY,
            f"{why}; TP's per-layer all-reduces: {TP_PENALTY * 100:.0f} points less",
        )
    if stage == 3:
        value, why = value - ZERO3_PENALTY, f"{why}; ZeRO-3 {ZERO3_PENALTY * 100:.0f} points less"
    return value, f"{card_key or 'unknown card'}, {stage_group(stage)}, {size}, TP={tp}: {why}"


@dataclass(frozen=True)
class Mfu:
    value: float
    source: str  # "estimate from the table (...)", "measured by bench/gpu_check.py (...)", ...
    note: str = ""  # what a >30B plan without tensor parallelism should expect, and why

    def line(self) -> str:
        """The plan's one line."""
        note = f"; {self.note}" if self.note else ""
        return f"plan: MFU {self.value:.0%} ({self.source}){note}"


def _measured_rows(path: str) -> list[dict[str, object]]:
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip().startswith("{")]
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"mfu_measured={path!r}: cannot read bench/gpu_check.py's JSON lines ({err}); "
            f"pass the file its --out wrote, or leave mfu_measured unset"
        ) from None
    return [r for r in rows if isinstance(r, dict)]


def measured(path: str, card_key: Optional[str], stage: int, params: float) -> Optional[Mfu]:
    """The GPU check's newest MFU for this card family, stage group and size band (None: none).

    Rows: `{"check": "device", "name": ...}` then rows with a `model` (a conf/model name) and an
    `mfu` (top level, or under `ours`), optionally `zero_stage` (bench/gpu_check.py runs ZeRO-2).
    """
    device: Optional[str] = None
    found: Optional[Mfu] = None
    for row in _measured_rows(path):
        if row.get("check") == "device":
            device = cards.card_key(str(row.get("name", "")))
            continue
        ours = row.get("ours")
        value = ours.get("mfu") if isinstance(ours, dict) else row.get("mfu")
        shape = OPT_SIZES.get(str(row.get("model", "")))
        row_stage = row.get("zero_stage", 2)
        if not isinstance(value, (int, float)) or not 0 < value <= 1 or shape is None:
            continue
        if family(device) != family(card_key) or not isinstance(row_stage, int):
            continue
        if stage_group(row_stage) != stage_group(stage) or band(param_count(shape)) != band(params):
            continue
        what = f"{row.get('check')} {row.get('model')} on {device}, {stage_group(row_stage)}"
        found = Mfu(
            float(value), f"measured by bench/gpu_check.py: {what}; {os.path.basename(path)}"
        )
    return found


def planned(cfg: RootConfig, tp: Optional[int] = None) -> Mfu:
    """The MFU this run's ETA assumes before it measured its own throughput (`tp`: the run's
    parallel.tensor unless given)."""
    numbers = derived_of(cfg)
    degree = numbers.tensor if tp is None else tp
    return numbers.once(("mfu", degree), lambda: _planned(cfg, degree))


def _planned(cfg: RootConfig, tp: int) -> Mfu:
    params = float(params_of(cfg))
    stage = int(cfg.deepspeed.stage)
    key = cards.card_key(cards.gpu_name(cfg)[0])
    note = ""
    if params > BIG and tp == 1:
        note = (
            f"above {BIG / 1e9:.0f}B without tensor parallelism expect less: each step "
            f"all-gathers the parameters (ZeRO-3) and reduces the gradients over data "
            f"parallelism alone, with the small micro batch that fits to hide them"
        )
    guess = cfg.mfu_guess
    if str(guess) != AUTO:
        if isinstance(guess, bool) or not isinstance(guess, (int, float)) or not 0 < guess <= 1:
            raise ConfigError(
                f"mfu_guess={guess!r}: must be a fraction in (0, 1] or auto (the table, or "
                f"the GPU check's measurement); e.g. mfu_guess=0.35"
            )
        return Mfu(float(guess), f"estimate, set by hand: mfu_guess={guess:g}", note)
    if cfg.mfu_measured:
        got = measured(str(cfg.mfu_measured), key, stage, params)
        if got is not None:
            return Mfu(got.value, f"estimate, {got.source}", note)
    value, why = table(key, stage, params, tp)
    if cards.gpu_name(cfg)[1]:
        why += "; cluster.gpu_type=auto: an H100 assumed"
    return Mfu(value, f"estimate from the table: {why}", note)
