"""Checkpoints load with torch's weights-only unpickler: a file never runs code when it is read.

A checkpoint is a pickle, and `torch.load(weights_only=False)` runs whatever its `__reduce__`
names: anyone who can write into the runs root could run code in every rank of the next resume.
Our own loads pass `weights_only=True`; DeepSpeed hard-codes `weights_only=False` in its universal
load, ds_to_universal and zero_to_fp32, so `enforce()` also sets torch's documented override
TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 for this process and its children (the converter runs as
`python -m slurmtrain.compute.checkpoint.safe_load deepspeed.checkpoint.ds_to_universal`).

The allow-list is the non-tensor types DeepSpeed and our RNG files pickle: DeepSpeed's ZeRO stage
enum, loss scalers and fragment addresses, numpy arrays (the RNG state). Each is a plain data
holder: unpickling one sets fields and calls no user code.
"""

from __future__ import annotations

import enum
import os
import pickle
import runpy
import sys
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import torch

FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_enforced = False


def safe_types() -> list[object]:
    """The allow-list (imported here, not at module import: the login node never loads torch)."""
    import numpy as np
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 renamed it; 1.x has core
    reconstruct = core.multiarray._reconstruct
    dtypes = [type(np.dtype(t)) for t in ("uint32", "int64", "float64", "bool")]
    return [
        ZeroStageEnum,
        LossScaler,
        DynamicLossScaler,
        fragment_address,
        np.ndarray,
        np.dtype,
        reconstruct,
        *dtypes,
    ]


def _enum_member(cls: object, name: str) -> enum.Enum:
    """`builtins.getattr` in a checkpoint: how Python 3.11.2 (Debian 12, container images) and
    3.12+ pickle an enum member. Only a member of an allow-listed enum resolves; anything else
    is refused, so the name grants no general attribute access."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and cls in safe_types():
        if name in cls.__members__:
            return cls[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not an allowed enum member")


def enforce() -> None:
    """Every torch.load of this process (and its children) weights-only, the allow-list known.
    Idempotent; called before the first load of a checkpoint."""
    global _enforced
    if _enforced:
        return
    import torch

    torch.serialization.add_safe_globals([*safe_types(), (_enum_member, "builtins.getattr")])
    os.environ[FORCE] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # torch refuses both at once
    _enforced = True


def load(
    path: Union[str, os.PathLike[str]],
    map_location: Union[str, torch.device, None] = None,
    **kwargs: object,
) -> object:
    """torch.load, weights only: a file naming any other global raises UnpicklingError unrun."""
    import torch

    enforce()
    return torch.load(path, map_location=map_location, weights_only=True, **kwargs)


def main(argv: list[str]) -> None:
    """`python -m slurmtrain.compute.checkpoint.safe_load MODULE ARGS...`: run MODULE as `-m`
    would, with the allow-list registered (a plain child inherits only the env override)."""
    if not argv:
        raise SystemExit("usage: python -m slurmtrain.compute.checkpoint.safe_load MODULE [ARGS]")
    enforce()
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
