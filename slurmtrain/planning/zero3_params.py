"""ZeRO-3's whole (gathered) parameters beyond each rank's partition, from the run's own settings.

Under stage 3 a rank holds 1/N of every parameter, plus whole copies of: the module running now
(memory.py's 4L term), the parameters prefetched for the next modules, and the persistent ones
(never partitioned). The last two follow the `zero_optimization` section DeepSpeed is given
(common/ds_config.zero_section, deepspeed.extra merged in), read by DeepSpeed's rules
(deepspeed 0.19.8, runtime/zero/partitioned_param_coordinator.py fetch_sub_module: after the
current module, it prefetches min(stage3_max_live_parameters - elements gathered now,
stage3_prefetch_bucket_size) elements; partition_parameters.py: a tensor of at most
stage3_param_persistence_threshold elements is kept whole). Pure arithmetic: no torch.
"""

from __future__ import annotations

from typing import Mapping, Optional

from slurmtrain.common import ds_config
from slurmtrain.planning import shapes
from slurmtrain.planning.shapes import ModelShape, largest_layer_params, param_count

# DeepSpeed's defaults (runtime/zero/config.py), for keys a zero section does not set.
DS_PREFETCH_BUCKET = 50_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_PERSISTENCE_THRESHOLD = 100_000


def settings(model: ModelShape, zero: Optional[Mapping[str, object]] = None) -> dict[str, int]:
    """The three stage-3 keys of `zero` (None: what slurmtrain gives DeepSpeed for this model,
    ds_config.stage3_section); a key missing from `zero` takes DeepSpeed's default."""
    if zero is None:
        zero = ds_config.stage3_section(model.hidden_size)
    return {
        "prefetch": _count(zero, "stage3_prefetch_bucket_size", DS_PREFETCH_BUCKET),
        "max_live": _count(zero, "stage3_max_live_parameters", DS_MAX_LIVE_PARAMETERS),
        "persist": _count(zero, "stage3_param_persistence_threshold", DS_PERSISTENCE_THRESHOLD),
    }


def _count(zero: Mapping[str, object], key: str, default: int) -> int:
    """An element count of the zero section (deepspeed.extra may give it as 5e7)."""
    value = zero.get(key, default)
    return int(value) if isinstance(value, (int, float, str)) else default


def tensor_sizes(model: ModelShape) -> list[int]:
    """Elements of every parameter tensor of transformers' model of this shape (any family)."""
    return shapes.tensor_sizes(model)


def persistent_elements(model: ModelShape, threshold: int) -> int:
    """Elements kept whole on every rank: the tensors of at most `threshold` elements."""
    return sum(n for n in tensor_sizes(model) if n <= threshold)


def prefetched_elements(model: ModelShape, prefetch: int, max_live: int) -> int:
    """Elements gathered ahead of the running module, at most: the running module is at most the
    largest (memory.py counts it), and the prefetch stops at max_live gathered in all."""
    p, big = param_count(model), largest_layer_params(model)
    return max(0, min(prefetch, max_live - big, p - big))


def extra_gathered(model: ModelShape, zero: Optional[Mapping[str, object]] = None) -> int:
    """Elements a stage-3 rank holds whole besides its partition and the running module."""
    s = settings(model, zero)
    return prefetched_elements(model, s["prefetch"], s["max_live"]) + persistent_elements(
        model, s["persist"]
    )
