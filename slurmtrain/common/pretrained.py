"""The identity of a `model.pretrained_path` folder: a checksum of its contents, for the fingerprint.

Computed on the login node (no torch) by login/prepare.py into `model.pretrained_checksum`, so two
fine-tunes from different weights never share a run directory (and a resubmission after the folder
changed starts a new run instead of resuming one trained from other weights).

What is hashed: config.json and every weight file (`*.safetensors`, their index, `*.bin`), whole.
A safetensors header holds names, dtypes, shapes and offsets but no values: two checkpoints of one
architecture have the same headers, so hashing headers (or sizes and mtimes) would give a fine-tune
of step 1000 and one of step 2000 the same fingerprint. Whole-file SHA-256 runs at ~1-2 GB/s (opt13b
bf16, 26 GB: ~15 s); each file's digest is cached under ~/.cache/slurmtrain keyed by path, size,
mtime and inode, so a resubmission reads nothing again unless a file changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from slurmtrain.common import hf_config
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig

WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "slurmtrain"


def files(folder: Path) -> list[Path]:
    """config.json and the weight files, in a fixed order."""
    config = folder / "config.json"
    weights = sorted({p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern)})
    if not config.is_file() or not weights:
        raise ConfigError(
            f"model.pretrained_path={folder}: not a Hugging Face model folder (needs config.json "
            f"and *.safetensors or *.bin weights); export one with `python -m slurmtrain.cli "
            f"export RUN_DIR --out DIR` and pass model.pretrained_path=DIR"
        )
    return [config, *weights]


def _file_digest(path: Path, cache: dict[str, str]) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    if key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    cache[key] = h.hexdigest()
    return cache[key]


def checksum(folder: Path) -> str:
    """sha256 over (name, sha256 of contents) of every file `files` lists."""
    cache_file = CACHE / "pretrained_digests.json"
    try:
        read: object = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        read = {}
    entries = read.items() if isinstance(read, dict) else ()
    cache = {str(key): value for key, value in entries if isinstance(value, str)}
    h = hashlib.sha256()
    for path in files(folder):
        h.update(f"{path.name}\0{_file_digest(path, cache)}\n".encode())
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(cache_file)
    except OSError:
        pass  # a cache that cannot be written only costs time
    return h.hexdigest()[:16]


# config.json key -> model.* key: the shapes the planner, FLOPs and data checks read from the config.
SHAPE_KEYS = {
    "model_type": "family",
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "ffn_dim": "ffn_dim",
    "intermediate_size": "ffn_dim",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "max_position_embeddings": "max_positions",
}


def resolve(cfg: RootConfig) -> None:
    """model.pretrained_path made absolute, its shape checked against model.*, its checksum
    recorded (fingerprinted)."""
    if not cfg.model.pretrained_path:
        return
    folder = Path(os.path.expanduser(str(cfg.model.pretrained_path))).resolve()
    listed = files(folder)
    source = json.loads(listed[0].read_text())
    for theirs, ours in SHAPE_KEYS.items():
        mine = getattr(cfg.model, ours)
        if ours == "num_kv_heads":
            mine = mine or cfg.model.num_heads
        if theirs in source and source[theirs] != mine:
            raise ConfigError(
                f"model.{ours}={mine}: model.pretrained_path={folder} has "
                f"{theirs}={source[theirs]}; pick the matching model group (model=hf reads the "
                f"folder's config) or set model.{ours}={source[theirs]}"
            )
    cfg.model.pretrained_path = str(folder)
    cfg.model.pretrained_checksum = checksum(folder)


def resolve_config(cfg: RootConfig) -> None:
    """model=hf: model.config (or, without it, model.pretrained_path) read into the model keys."""
    hf_config.resolve(cfg)
