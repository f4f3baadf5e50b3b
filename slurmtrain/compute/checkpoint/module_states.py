"""Under ZeRO-1/2 every rank writes its share: the model-states file carries no module weights.

DeepSpeed has rank 0 write the whole module into `mp_rank_00_model_states.pt` and every rank read it
back on resume, though the fp32 partitions every rank writes hold the same weights at full
precision, and with `zero_optimization.load_from_fp32_weights` (the default) the load takes them
from there. So `strip` (called by the shard writer) leaves out every parameter the ZeRO optimizer
owns (and tied names aliasing one), keeping buffers, frozen parameters and DeepSpeed's metadata,
all that `ds_to_universal` and `zero_to_fp32` read there. Per rank a save is then 12 P / N bytes
(fp32 weights + 2 Adam moments) and rank 0 adds only metadata. ZeRO-0 and ZeRO-3 are unchanged.

Loading such a file: `install` wraps two DeepSpeedEngine methods once per process (no change for
other checkpoints): the module load accepts exactly the left-out names as missing, and once the
partitions are loaded the bit16 weights are rebuilt from them (`update_lp_params`). A load that
would not read the partitions (module only) is refused with one line.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

# The model-states entry that lists the names left out of `module` (they are in the partitions)
OMITTED = "slurmtrain_module_in_partitions"


def strip(state: object, path: str) -> object:
    """`state` without the module weights when it is a ZeRO-1/2 model-states dict (a shallow
    copy: the engine's own dict and tensors are untouched); anything else unchanged."""
    if not str(path).endswith("model_states.pt") or not isinstance(state, dict):
        return state
    shapes, module = state.get("param_shapes"), state.get("module")
    config = state.get("ds_config")
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    if not shapes or not isinstance(module, dict) or not isinstance(zero, dict):
        return state
    if zero.get("stage") not in (1, 2) or zero.get("load_from_fp32_weights", True) is False:
        return state
    owned = {name for group in shapes for name in group}
    owned |= set(state.get("shared_params") or {})  # a tied name aliases an owned parameter
    kept = module.__class__()
    for name, value in module.items():
        if name not in owned:
            kept[name] = value
    kept.__dict__.update(getattr(module, "__dict__", {}))  # _metadata: module versions
    return {**state, "module": kept, OMITTED: sorted(set(module) - set(kept))}


def install() -> None:
    """Teach DeepSpeedEngine to load a stripped model-states file (once per process)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    if getattr(DeepSpeedEngine, "_slurmtrain_partitions_only", False):
        return
    load_checkpoint = DeepSpeedEngine.load_checkpoint
    load_module = DeepSpeedEngine.load_module_state_dict

    @functools.wraps(load_checkpoint)
    def load_checkpoint_(
        self: DeepSpeedEngine,
        load_dir: str,
        tag: Optional[str] = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        custom_load_fn: Optional[Callable[..., object]] = None,
    ) -> tuple[Optional[str], object]:
        self._slurmtrain_load = {
            "partitions": load_optimizer_states and not load_module_only,
            "refresh": False,
        }
        try:
            out: tuple[Optional[str], object] = load_checkpoint(
                self,
                load_dir,
                tag,
                load_module_strict=load_module_strict,
                load_optimizer_states=load_optimizer_states,
                load_lr_scheduler_states=load_lr_scheduler_states,
                load_module_only=load_module_only,
                custom_load_fn=custom_load_fn,
            )
            if out[0] is not None and self._slurmtrain_load["refresh"]:
                self.optimizer.update_lp_params()  # bit16 weights from the fp32 partitions
            return out
        finally:
            self._slurmtrain_load = None

    @functools.wraps(load_module)
    def load_module_(
        self: DeepSpeedEngine, checkpoint: Mapping[str, object], *args: object, **kwargs: object
    ) -> object:
        omitted = checkpoint.get(OMITTED) if isinstance(checkpoint, dict) else None
        if not omitted or not isinstance(omitted, list):  # `strip` writes a sorted list
            return load_module(self, checkpoint, *args, **kwargs)
        context = getattr(self, "_slurmtrain_load", None)
        if (
            context is None
            or not context["partitions"]
            or self.zero_optimization_stage() not in (1, 2)
            or not self.zero_load_from_fp32_weights()
        ):
            raise RuntimeError(
                "this checkpoint keeps its module weights only in the ZeRO-1/2 fp32 partitions: "
                "load it with its optimizer states under ZeRO-1/2 (load_optimizer_states=True, "
                "zero_optimization.load_from_fp32_weights=true), or export it first "
                "(python -m slurmtrain.cli export RUN_DIR --out DIR) and start from the export"
            )
        context["refresh"] = True
        names = ("strict", "custom_load_fn", "fetch_z3_params", "z3_params_to_fetch")
        kwargs.update(zip(names, args))
        passed = kwargs.pop("allowed_missing_keys", None)
        allowed = list(passed) if passed and isinstance(passed, Iterable) else []
        kwargs.setdefault("strict", True)
        return load_module(self, checkpoint, allowed_missing_keys=allowed + omitted, **kwargs)

    DeepSpeedEngine.load_checkpoint = load_checkpoint_
    DeepSpeedEngine.load_module_state_dict = load_module_
    DeepSpeedEngine._slurmtrain_partitions_only = True
