"""Under ZeRO-1/2 every rank writes its share: the model-states file carries no module weights.

DeepSpeed has rank 0 write the whole module into `mp_rank_00_model_states.pt` and every rank read it
back on resume, though the fp32 partitions every rank writes hold the same weights at full
precision, and with `zero_optimization.load_from_fp32_weights` (the default) the load takes them
from there. So `strip` (called by the shard writer) leaves out every parameter the ZeRO optimizer
owns (and tied names aliasing one), keeping buffers, frozen parameters and DeepSpeed's metadata,
all that `ds_to_universal` and `zero_to_fp32` read there. Per rank a save is then 12 P / N bytes
(fp32 weights + 2 Adam moments) and rank 0 adds only metadata. ZeRO-0 and ZeRO-3 are unchanged.

Loading such a file: `load` calls `engine.load_checkpoint` with DeepSpeed's `custom_load_fn`, whose
module load accepts exactly the left-out names as missing; once the partitions are loaded the
bit16 weights are rebuilt from them (the ZeRO optimizer's `update_lp_params`). A load that would
not read the partitions (ZeRO-0/3, or `load_from_fp32_weights=false`) is refused with one line.
No DeepSpeed method is replaced: other checkpoints load exactly as DeepSpeed loads them; one is
narrowed for the load's duration: DeepSpeed stats every rank's partition file on every rank (N
stats per rank, N^2 on the shared tier per restart) though each rank opens only its own, so
`_own_partition_names` names them without the stats (bench/restart_ops.py: flat in node count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from torch.nn import Module

# The model-states entry that lists the names left out of `module` (they are in the partitions)
OMITTED = "slurmtrain_module_in_partitions"
REFUSED = (
    "this checkpoint keeps its module weights only in the ZeRO-1/2 fp32 partitions: "
    "load it with its optimizer states under ZeRO-1/2 (load_optimizer_states=True, "
    "zero_optimization.load_from_fp32_weights=true), or export it first "
    "(python -m slurmtrain.cli export RUN_DIR --out DIR) and start from the export"
)


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


def load(engine: DeepSpeedEngine, load_dir: str, tag: str) -> Optional[str]:
    """`engine.load_checkpoint(load_dir, tag)` that also loads a model-states file `strip` wrote:
    DeepSpeed's own `custom_load_fn` loads the module, accepting as missing only the parameters
    the fp32 partitions restore; then the bit16 weights are rebuilt from those partitions. The
    loaded path, or None (DeepSpeed found nothing to load)."""
    seen: dict[str, set[str]] = {}
    narrowed = _own_partition_names(engine)
    try:
        path, client_state = engine.load_checkpoint(
            load_dir,
            tag=tag,
            custom_load_fn=lambda src, dst: seen.update(_module(engine, src, dst)),
        )
    finally:
        if narrowed:
            del engine._get_all_zero_checkpoint_names  # the class's own again
    if path is None:
        return None
    omitted = client_state.get(OMITTED) if isinstance(client_state, dict) else None
    missing = seen.get("missing", set())
    if missing - set(omitted if isinstance(omitted, list) else ()):
        raise RuntimeError(f"{load_dir}/{tag}: module weights missing: {sorted(missing)[:8]}")
    if missing:
        engine.optimizer.update_lp_params()  # bit16 weights from the fp32 partitions
    return str(path)


def _module(engine: DeepSpeedEngine, src: Mapping[str, object], dst: Module) -> dict[str, set[str]]:
    """Load `src` into `dst` as a strict load would, except that trainable parameters may be
    missing where this load reads them from the ZeRO-1/2 fp32 partitions (`load` then checks
    they are the ones `strip` left out)."""
    result = dst.load_state_dict(src, strict=False)
    missing, unexpected = set(result.missing_keys), set(result.unexpected_keys)
    trainable = {n for n, p in dst.named_parameters(remove_duplicate=False) if p.requires_grad}
    if unexpected or missing - trainable:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(dst).__name__}: missing keys "
            f"{sorted(missing - trainable)}, unexpected keys {sorted(unexpected)}"
        )
    if missing and (
        engine.zero_optimization_stage() not in (1, 2) or not engine.zero_load_from_fp32_weights()
    ):
        raise RuntimeError(REFUSED)
    return {"missing": missing}


def _own_partition_names(engine: DeepSpeedEngine) -> bool:
    """For this load: the ZeRO partition files' names without DeepSpeed's existence check of each
    (only this rank's is opened unless the load is elastic; a missing own file still fails its
    open, and the manifest, checked before the load, lists every one). True when narrowed."""
    if engine.zero_elastic_checkpoint() or not hasattr(
        engine, "_get_mp_rank_zero_checkpoint_names"
    ):
        return False

    def names(load_dir: str, tag: str, bf16_mode: bool) -> list[str]:
        return list(
            engine._get_mp_rank_zero_checkpoint_names(
                load_dir=load_dir,
                tag=tag,
                mp_rank=engine.checkpoint_mp_rank,
                dp_world_size=engine.loaded_checkpoint_dp_world_size,
                bf16_mode=bf16_mode,
            )
        )

    engine._get_all_zero_checkpoint_names = names  # an instance attribute: deleted after the load
    return True
