"""A run's consolidated weights, for export and sample: find the run, pick a checkpoint, read it.

Consolidation is DeepSpeed's own (`zero_to_fp32`, lazy mode), from the checkpoint as written,
whatever the world size that wrote it: ZeRO-3 materializes one parameter at a time, ZeRO-1/2 hold
the whole fp32 model once, ZeRO-0 fp32 reads the memory-mapped module weights.
"""

from __future__ import annotations

import os
import pickle
import re
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

from slurmtrain.common import checkpoint_format
from slurmtrain.common.rundir import RunDir, runs_named
from slurmtrain.compute.checkpoint import safe_load

if TYPE_CHECKING:
    import torch

TIED = "lm_head.weight"


class LazyTensor(Protocol):
    """A tensor, or DeepSpeed's lazy GatheredTensor (`.contiguous()` materializes it)."""

    shape: torch.Size
    dtype: torch.dtype

    def contiguous(self) -> torch.Tensor: ...


StateDict = dict[str, LazyTensor]


class ExportError(Exception):
    """A bad input: one line, exit 2."""


def quiet() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    import logging

    for name in ("DeepSpeed", "deepspeed", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def find_run(arg: str) -> Path:
    """A run directory by path, or by run name under $SLURMTRAIN_RUNS_ROOT (default ./runs)."""
    found, root = runs_named(arg)
    if len(found) == 1:
        return found[0].path
    if len(found) > 1:
        raise ExportError(
            f"run name {arg!r} has {len(found)} run directories under {root}: "
            f"{', '.join(str(r.path) for r in found)}; pass one of them"
        )
    raise ExportError(
        f"RUN_DIR={arg!r}: no config.yaml there and no run of that name under "
        f"{root}; pass a run directory (runs/NAME/FINGERPRINT)"
    )


def pick_checkpoint(run: Path, step: Optional[int]) -> tuple[Path, checkpoint_format.Manifest]:
    """`step_N/` (validated) or the newest checkpoint that validates, with its manifest."""
    root = RunDir(run).checkpoints
    if step is None:
        found = checkpoint_format.find_resumable(root)
        for skipped, why in found.skipped:
            print(f"slurmtrain export: skipping {skipped}: {why}", file=sys.stderr)
        if found.path is None:
            raise ExportError(
                f"RUN_DIR={run}: no checkpoint validates under {root}; train it "
                f"further or pick one with --step N"
            )
        return found.path, found.manifest
    path = root / checkpoint_format.tag(step)
    reason = checkpoint_format.validate(path) if path.is_dir() else "no such checkpoint"
    if reason is not None:
        have = ", ".join(p.name for p in checkpoint_format.step_dirs(root)) or "none"
        raise ExportError(f"--step={step}: {path}: {reason}; checkpoints: {have}")
    return path, checkpoint_format.read_manifest(path)


def lazy_state_dict(ckpt_dir: Path) -> StateDict:
    """name -> tensor or DeepSpeed's lazy GatheredTensor (`.contiguous()` materializes it); a
    file torch's weights-only loader refuses is an ExportError naming it and the globals it holds
    (torch's own message is a 36-line traceback advising weights_only=False)."""
    safe_load.enforce()  # zero_to_fp32 passes weights_only=False itself: the override covers it
    try:
        return _state_dict(ckpt_dir)
    except pickle.UnpicklingError as err:
        raise ExportError(unsafe_line(ckpt_dir, str(err))) from None


def unsafe_line(ckpt_dir: Path, error: str) -> str:
    """The refusal of a checkpoint holding pickled objects outside the allow-list: the first file
    that holds some (read as torch would, its data never unpickled) and their names."""
    import torch

    names = sorted(set(re.findall(r"GLOBAL (\S+)", error)))
    where = ckpt_dir
    for path in sorted(ckpt_dir.glob("*.pt")):
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # noqa: BLE001  not a torch zip file: the loader said why already
            continue
        if found:
            where, names = path, sorted(found)
            break
    have = ", ".join(p.name for p in checkpoint_format.step_dirs(ckpt_dir.parent)) or "none"
    return (
        f"{where}: holds pickled objects torch's safe loader refuses ({', '.join(names) or '?'});"
        f" not loaded (unpickling them could run code). Fix: pick another checkpoint with --step N"
        f" (checkpoints: {have}); if the type is DeepSpeed's own, add it to the allow-list in "
        f"slurmtrain/compute/checkpoint/safe_load.py"
    )


def _state_dict(ckpt_dir: Path) -> StateDict:
    if any(ckpt_dir.glob("*mp_rank_01_model_states.pt")):  # AutoTP's second shard: TP > 1
        return tensor_parallel_state_dict(ckpt_dir)
    if list(ckpt_dir.glob("*_optim_states.pt")):
        from deepspeed.utils import zero_to_fp32

        with _stdout_to_stderr():  # it prints progress lines and tqdm bars
            lazy: StateDict = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
                str(ckpt_dir.parent), tag=ckpt_dir.name, lazy_mode=True
            )
            return lazy
    # ZeRO-0 in fp32 keeps the optimizer inside the model-states file: the module is the model.
    path = ckpt_dir / "mp_rank_00_model_states.pt"
    states = safe_load.load(path, "cpu", mmap=True)
    if not isinstance(states, dict):
        raise ExportError(f"{path}: not a DeepSpeed model-states file")
    module: StateDict = dict(states["module"])
    for name, source in (states.get("shared_params") or {}).items():
        module.setdefault(name, module[source])
    return module


def tensor_parallel_state_dict(ckpt_dir: Path) -> StateDict:
    """A tensor-parallel (AutoTP) checkpoint's whole parameters: zero_to_fp32 reads one
    model-parallel rank's shards only, so the shards are gathered by DeepSpeed's universal
    conversion (the one a resume on another world size uses, cached beside the step as
    step_N_universal/), which writes each parameter whole: zero/<name>/fp32.pt."""
    from slurmtrain.compute.checkpoint import reshape

    manifest = checkpoint_format.read_manifest(ckpt_dir)
    print(
        f"slurmtrain: {ckpt_dir.name} is tensor-parallel: gathering its shards through "
        f"DeepSpeed's universal checkpoint ({reshape.universal_dir(ckpt_dir).name})",
        file=sys.stderr,
    )
    try:
        converted = reshape.convert(ckpt_dir, manifest, verify="size")
    except reshape.ReshapeError as e:
        raise ExportError(f"{ckpt_dir}: the tensor-parallel shards did not gather: {e}") from None
    state: StateDict = {}
    for folder in sorted((converted.path / "zero").iterdir()):
        if (folder / "fp32.pt").is_file():
            loaded = safe_load.load(folder / "fp32.pt", "cpu", mmap=True)
            assert isinstance(loaded, dict), folder
            state[folder.name] = loaded["param"]
    return state


class _stdout_to_stderr:
    def __enter__(self) -> None:
        sys.stdout.flush()
        self._saved = os.dup(1)
        os.dup2(2, 1)

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        os.dup2(self._saved, 1)
        os.close(self._saved)


def materialize(tensor: LazyTensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    out = tensor.contiguous()
    return out.to(dtype) if dtype is not None and out.is_floating_point() else out
