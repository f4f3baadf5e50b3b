"""Which GPU a plan is for, and how much memory that card reports.

`cluster.gpu_type`: a card name (`H100`, `h200`, `nvidia_h100_80gb_hbm3`, `a100-sxm4-80gb`: Slurm
GRES types and torch.cuda.get_device_name() strings alike), or `auto`: the partition's GRES type
where the partition names one (login/placement.py), else an H100 80GB, said in the plan.

`cluster.gpu_mem_gb` is in GiB *as the card reports it*: torch.cuda.mem_get_info()[1] / 2**30,
what PyTorch's caching allocator can ever hold (nvidia-smi's MiB total / 1024 is ~0.5 GiB more;
the marketed "80 GB" is neither). `auto`: the figure below for the card. An H100 80GB reports
~79.1 GiB, so a plan of 79.5 GiB/GPU that "fits in 80" does not run. bench/gpu_check.py passes
the measured figure (cluster.gpu_mem_gb=<mem_get_info total / 2**30>): set by hand, it wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.planning import flops

AUTO = "auto"
GiB = 2**30
DEFAULT_CARD = "H100"  # cluster.gpu_type=auto without a partition that names its GPUs

# torch.cuda.mem_get_info()[1] / 2**30 by (card, marketed GB): nvidia-smi's total less the
# driver's reserve. H100 80GB HBM3: nvidia-smi 81559 MiB (79.6 GiB, seen on this project's lent
# machine), PyTorch ~79.1-79.2 GiB; H200: nvidia-smi 143771 MiB (140.4 GiB, seen here), PyTorch
# ~139.8; A100: 79.1 (80GB) and 39.4 (40GB). Leads, rounded down: the GPU check's measured
# figure (cluster.gpu_mem_gb) replaces them.
REPORTED_GIB: dict[tuple[str, int], float] = {
    ("H100-SXM", 80): 79.1,
    ("H100-PCIe", 80): 79.1,
    ("H800", 80): 79.1,
    ("H200", 141): 139.8,
    ("A100", 80): 79.1,
    ("A100", 40): 39.4,
    ("A800", 80): 79.1,
}
# The marketed size when the name does not say it (the smaller part where there are two).
DEFAULT_GB = {"H100-SXM": 80, "H100-PCIe": 80, "H800": 80, "H200": 141, "A100": 40, "A800": 80}


def card_key(name: str) -> Optional[str]:
    """flops.PEAK_TFLOPS's key for a card name or a Slurm GRES type (`h100_80gb` -> H100-SXM)."""
    return flops.peak_key(re.sub(r"[_\-:]+", " ", name or ""))


def marketed_gb(name: str) -> Optional[int]:
    """The size in a card's name: `a100-sxm4-80gb`, `NVIDIA H100 80GB HBM3` -> 80; None if none."""
    m = re.search(r"(\d{2,3})\s*g(?:b|ib)?\b", re.sub(r"[_\-:]+", " ", name or ""), re.I)
    return int(m[1]) if m else None


@dataclass(frozen=True)
class Card:
    """The plan's GPU: its name as configured, its PEAK_TFLOPS key, its memory and where from."""

    name: str  # cluster.gpu_type as given, or DEFAULT_CARD for auto
    key: Optional[str]  # flops.PEAK_TFLOPS key; None: a card the planner does not know
    mem_bytes: int
    mem_source: str  # "cluster.gpu_mem_gb=79.6" or "H100 80GB as PyTorch reports it"
    assumed: bool  # gpu_type=auto without a GRES type: DEFAULT_CARD assumed

    @property
    def mem_gib(self) -> float:
        return self.mem_bytes / GiB


def gpu_name(cfg: RootConfig) -> tuple[str, bool]:
    """(cluster.gpu_type, or DEFAULT_CARD when auto; whether it was assumed)."""
    name = str(cfg.cluster.gpu_type or AUTO)
    return (DEFAULT_CARD, True) if name == AUTO else (name, False)


def card(cfg: RootConfig) -> Card:
    """The card this run plans for (cluster.gpu_type) and the memory it reports (gpu_mem_gb)."""
    name, assumed = gpu_name(cfg)
    key = card_key(name)
    given = cfg.cluster.gpu_mem_gb
    if str(given) != AUTO:
        gib = float(given)
        return Card(name, key, int(gib * GiB), f"cluster.gpu_mem_gb={gib:g}", assumed)
    size = marketed_gb(name) or (DEFAULT_GB.get(key) if key else None)
    gib_auto = REPORTED_GIB.get((key, size)) if key and size else None
    if gib_auto is None:
        raise ConfigError(
            f"cluster.gpu_mem_gb=auto: the planner has no memory figure for "
            f"cluster.gpu_type={name!r}; set cluster.gpu_mem_gb to the GiB the card reports "
            f"(torch.cuda.mem_get_info()[1] / 2**30, e.g. cluster.gpu_mem_gb=79.1 for an H100 80GB)"
        )
    label = f"{key} {size}GB as PyTorch reports it"
    label += "; cluster.gpu_type=auto: an H100 assumed" if assumed else ""
    return Card(name, key, int(gib_auto * GiB), label, assumed)


def peak_tflops(cfg: RootConfig, dtype: str) -> Optional[float]:
    """The dense peak the plan divides by: `peak_tflops` set by hand, else the card's."""
    if cfg.peak_tflops:
        return float(cfg.peak_tflops)
    key = card_key(gpu_name(cfg)[0])
    return flops.PEAK_TFLOPS[key].get(dtype) if key else None
