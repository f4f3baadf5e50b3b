"""The model for a resume: built without initialising weights the checkpoint overwrites.

A fresh model draws every weight from the generator (transformers' init: seconds to minutes for
billions of parameters, all thrown away when a checkpoint loads). When the attempt resumes a
checkpoint of its own world size under ZeRO 0-2, the load replaces every parameter (ZeRO-0: the
module's state; ZeRO-1/2: the fp32 partitions, copied into the bit16 weights) and every persistent
buffer, and restores the RNG: so the model is built on the meta device (no memory, no init) and
given uninitialised storage on its device (`to_empty`), ties re-made. Resumes stay bitwise.

Not here: ZeRO-3 (zero.Init partitions at construction, its own path), another world size (the
universal load), a pretrained start (its weights come from the files), and models with
non-persistent buffers (rotary tables: not in any checkpoint, they need their constructor's values).
"""

from __future__ import annotations

import torch

from slurmtrain.common.schema import RootConfig


def skips_init(cfg: RootConfig, resuming: bool, same_world: bool) -> bool:
    """Whether the checkpoint about to load overwrites everything a fresh build would set."""
    return (
        resuming
        and same_world
        and int(cfg.deepspeed.stage) in (0, 1, 2)
        and not cfg.model.pretrained_path
    )


def build(
    cfg: RootConfig,
    ds_config: dict[str, object],
    device: torch.device,
    skip_init: bool,
    mpu: object = None,
) -> torch.nn.Module:
    """model.build(...), or (skip_init) the same module with uninitialised weights on `device`."""
    from slurmtrain.compute import model

    if not skip_init:
        return model.build(cfg, ds_config, device, mpu)
    net = model.build(cfg, ds_config, torch.device("meta"), mpu)
    if _non_persistent_buffers(net):
        return model.build(cfg, ds_config, device, mpu)
    net.to_empty(device=torch.device(device))
    if hasattr(net, "tie_weights"):  # to_empty gives each module its own tensor: tie them again
        net.tie_weights()
    return net


def _non_persistent_buffers(net: torch.nn.Module) -> bool:
    return any(m._non_persistent_buffers_set for m in net.modules())
