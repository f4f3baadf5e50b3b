"""`python -m slurmtrain.cli export RUN_DIR --out DIR`: a run's checkpoint as a Hugging Face folder.

Any family: config.json is the run's `model` config (compute/model.py `model_config`), loaded back
with AutoModelForCausalLM. Writes it, generation_config.json, safetensors shards (+ index), the
tokenizer files when the run's token file was made with a tokenizer folder, and
`slurmtrain_export.json` (run, step, sha256 of the checkpoint's manifest, dtype, measured error).

The weights are consolidated by compute/weights.py. The check (--no-verify skips it) loads the
model twice, the training model with the fp32 weights and the export through `from_pretrained`,
compares their logits on a batch of the run's own data, and checks the export's loss against the
next step's logged loss when metrics.jsonl has it.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, Optional, TypedDict

from slurmtrain.common.jsonl import read_jsonl
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute.weights import (
    TIED,
    ExportError,
    StateDict,
    find_run,
    lazy_state_dict,
    materialize,
    pick_checkpoint,
    quiet,
)

if TYPE_CHECKING:
    import torch

EXPORT_META = "slurmtrain_export.json"
# Largest |logit difference| between the export and the training model: fp32 is the same
# arithmetic on the same weights; bf16 rounds every weight, so its bound scales with the largest logit.
TOLERANCE = {"fp32": 1e-5, "bf16": 3e-2}


class LossCheck(TypedDict):
    step: int
    logged: float
    export: float
    abs_diff: float


class ExportCheck(TypedDict):
    check_samples: int
    seq_len: int
    max_abs_logit_diff: float
    max_abs_logit: float
    tolerance: float
    ok: bool
    training_loss: NotRequired[LossCheck]


class ExportRecord(TypedDict):
    """slurmtrain_export.json."""

    run: str
    fingerprint: str
    step: int
    checkpoint: str
    manifest_sha256: str
    world_size: object
    zero_stage: object
    dtype: str
    shards: list[str]
    tokenizer: str
    time: float
    check: NotRequired[ExportCheck]
    seconds: NotRequired[float]


def hf_keys(state: StateDict, tied: bool) -> StateDict:
    """The names `from_pretrained` expects: a tied lm_head (OPT's, model.tie_embeddings) is not
    written (transformers re-ties it on load); an untied head is kept."""
    state = dict(state)
    if tied and TIED in state:
        del state[TIED]
    return state


def write_weights(
    state: StateDict, out: Path, dtype: torch.dtype, max_shard_size: str
) -> list[str]:
    """safetensors shards, one in memory at a time, + model.safetensors.index.json if sharded."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    shapes = {
        k: torch.empty(
            tuple(v.shape), dtype=dtype if v.dtype.is_floating_point else v.dtype, device="meta"
        )
        for k, v in state.items()
    }
    split = split_torch_state_dict_into_shards(
        shapes, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size
    )
    for filename, names in split.filename_to_tensors.items():
        shard = {name: materialize(state[name], dtype) for name in names}
        save_file(shard, str(out / filename), metadata={"format": "pt"})
        del shard
        gc.collect()
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(
            json.dumps(index, indent=2, sort_keys=True) + "\n"
        )
    return list(split.filename_to_tensors)


def write_folder(
    cfg: RootConfig, state: StateDict, out: Path, dtype: torch.dtype, max_shard_size: str = "2GB"
) -> tuple[StateDict, list[str]]:
    """The Hugging Face folder of the run's model with `state`'s weights: config.json (the run's
    transformers config: model=hf's own config.json with the run's overrides), the generation
    config and the safetensors shards. Returns the state as written and the shard names."""
    from transformers import GenerationConfig

    from slurmtrain.compute.model import model_class, model_config

    config = model_config(cfg)
    config.dtype = dtype
    config.architectures = [model_class(cfg).__name__]
    config.use_cache = True
    state = hf_keys(state, bool(config.tie_word_embeddings))
    shards = write_weights(state, out, dtype, max_shard_size)
    config.save_pretrained(str(out))
    GenerationConfig.from_model_config(config).save_pretrained(str(out))
    return state, shards


def tokenizer_dir(cfg: RootConfig) -> Optional[Path]:
    """The tokenizer folder the run's token file was made with (its sidecar), or None (bytes)."""
    if cfg.data.kind != "tokens" or not cfg.data.path:
        return None
    sidecar = Path(cfg.data.path).with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for key in ("tokenizer_dir", "tokenizer"):
        value = meta.get(key)
        if value and value != "bytes":
            path = Path(value) if os.path.isabs(value) else sidecar.parent / value
            if path.is_dir():
                return path
    return None


def check_batch(cfg: RootConfig, step: int, limit: Optional[int]) -> torch.Tensor:
    """The global batch training would see at step `step` (first `limit` samples), (B, seq+1)."""
    import torch

    from slurmtrain.compute import data

    loaded = data.load(cfg.data)  # the training windows (held-out split, blends) and order
    tokens, sampler = loaded.train, loaded.sampler
    assert cfg.train.global_batch_size is not None  # config.yaml holds it resolved
    gbs = int(cfg.train.global_batch_size)
    ids = [sampler.sample(step * gbs + i) for i in range(gbs if limit is None else min(gbs, limit))]
    return torch.from_numpy(data.batch(tokens, ids, cfg.data.seq_len))


def verify(
    cfg: RootConfig,
    run: Path,
    out: Path,
    state: StateDict,
    step: int,
    dtype_name: str,
    samples: int,
) -> ExportCheck:
    """Logits of the export (from_pretrained) against the training model with the fp32 weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from slurmtrain.compute.model import loss_fn, model_class, model_config

    torch.manual_seed(0)
    reference = model_class(cfg)(model_config(cfg))
    missing, unexpected = reference.load_state_dict(
        {k: materialize(v) for k, v in state.items()}, strict=False
    )
    if [k for k in missing if k != TIED] or unexpected:
        raise RuntimeError(
            f"checkpoint does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    reference.eval()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    exported = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=dtype, local_files_only=True
    ).eval()
    window = check_batch(cfg, step, samples)
    with torch.no_grad():
        want = reference(input_ids=window[:, :-1]).logits.float()
        got = exported(input_ids=window[:, :-1]).logits.float()
    diff = float((want - got).abs().max())
    scale = float(want.abs().max())
    tolerance = TOLERANCE[dtype_name] * (1.0 if dtype_name == "fp32" else max(1.0, scale))
    result: ExportCheck = {
        "check_samples": int(window.shape[0]),
        "seq_len": int(cfg.data.seq_len),
        "max_abs_logit_diff": diff,
        "max_abs_logit": scale,
        "tolerance": tolerance,
        "ok": diff <= tolerance,
    }
    logged = _logged_losses(run).get(step + 1)
    if logged is not None:
        # The loss logged at step N+1 was computed by the weights of step N on the global batch of
        # step N: an independent check of the consolidation, not only of the writing.
        full = check_batch(cfg, step, None)
        with torch.no_grad():
            loss = float(loss_fn(exported, full))
        result["training_loss"] = {
            "step": step + 1,
            "logged": logged,
            "export": loss,
            "abs_diff": abs(loss - logged),
        }
    del reference, exported
    gc.collect()
    return result


def _logged_losses(run: Path) -> dict[int, Optional[float]]:
    """step -> the loss metrics.jsonl logged there (the last row of a step wins)."""
    out: dict[int, Optional[float]] = {}
    for row in read_jsonl(RunDir(run).metrics):
        step, loss = row.get("step"), row.get("loss")
        if isinstance(step, int):
            out[step] = loss if isinstance(loss, (int, float)) else None
    return out


def export(
    run: Path,
    out: Path,
    step: Optional[int] = None,
    dtype_name: str = "fp32",
    max_shard_size: str = "2GB",
    check: bool = True,
    samples: int = 4,
    force: bool = False,
) -> ExportRecord:
    """Write the folder (into `out.tmp`, renamed when complete); returns its provenance record."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ExportError(
            f"--out={out}: exists and is not empty; pick a new folder or pass --force"
        )
    ckpt_dir, manifest = pick_checkpoint(run, step)
    import torch

    from slurmtrain.common.schema import load_run_config

    cfg = load_run_config(str(RunDir(run).config))
    saved = manifest["step"]
    if not isinstance(saved, int):
        raise ExportError(f"{ckpt_dir}: its manifest has no step number")
    step = saved
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.time()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    state, shards = write_folder(cfg, lazy_state_dict(ckpt_dir), tmp, dtype, max_shard_size)
    tok = tokenizer_dir(cfg)
    if tok is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tok), local_files_only=True).save_pretrained(str(tmp))
    record: ExportRecord = {
        "run": str(run),
        "fingerprint": run.name,
        "step": step,
        "checkpoint": str(ckpt_dir),
        "manifest_sha256": hashlib.sha256((ckpt_dir / "manifest.json").read_bytes()).hexdigest(),
        "world_size": manifest.get("world_size"),
        "zero_stage": manifest.get("zero_stage"),
        "dtype": dtype_name,
        "shards": shards,
        "tokenizer": str(tok) if tok else "bytes",
        "time": time.time(),
    }
    if check:
        record["check"] = verify(cfg, run, tmp, state, step, dtype_name, samples)
    record["seconds"] = time.time() - started
    (tmp / EXPORT_META).write_text(json.dumps(record, indent=1) + "\n")
    for path in tmp.iterdir():
        path.chmod(0o644)  # safetensors writes 0600: an export is meant to be shared
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return record


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slurmtrain.cli export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", help="run directory (runs/NAME/FINGERPRINT) or run name")
    parser.add_argument("--out", required=True, type=Path, help="output folder (new or empty)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: newest that validates)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--max-shard-size", default="2GB")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the logits check (it holds the whole model twice)",
    )
    parser.add_argument("--check-samples", type=int, default=4)
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    args = parser.parse_args(argv)
    quiet()
    try:
        run = find_run(args.run_dir)
        record = export(
            run,
            args.out.expanduser().resolve(),
            args.step,
            args.dtype,
            args.max_shard_size,
            not args.no_verify,
            args.check_samples,
            args.force,
        )
    except ExportError as err:
        print(f"slurmtrain export: {err}", file=sys.stderr)
        return 2
    check = record.get("check")
    print(
        f"slurmtrain export: step {record['step']} of {record['run']} -> {args.out} "
        f"({record['dtype']}, {len(record['shards'])} shard(s), {record['seconds']:.1f} s)"
    )
    if check:
        line = (
            f"slurmtrain export: logits vs the training model: max |diff| "
            f"{check['max_abs_logit_diff']:.2e} (tolerance {check['tolerance']:.1e})"
        )
        if "training_loss" in check:
            t = check["training_loss"]
            line += f"; loss {t['export']:.6f} vs logged {t['logged']:.6f} at step {t['step']}"
        print(line)
        if not check["ok"]:
            print(
                "slurmtrain export: the export does not reproduce the training model's logits",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
