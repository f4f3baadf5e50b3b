"""Data checks of a config: token files, their sidecars and blends (validation.py calls these)."""

from __future__ import annotations

import json
import os
from typing import Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import DataConfig, DataKind, RootConfig


def check_positive(key: str, value: object) -> None:
    """A whole number >= 1 (shared with validation.py)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}={value!r}: must be a positive integer; e.g. {key}=1")


def _token_file(key: str, path: Optional[str], vocab_size: int) -> Optional[int]:
    """A token file must exist and fit the model's vocabulary; returns its token count if known."""
    if not path or not os.path.isfile(path):
        raise ConfigError(
            f"{key}={path!r}: no such token file; make one with "
            f"`slurmtrain prepare-data --out FILE.bin TEXT_FILES` and pass {key}=FILE.bin, "
            f"or train on the text itself: data=text data.path=FILE_OR_DIR"
        )
    meta = _sidecar(os.path.splitext(path)[0] + ".json")
    vocab = meta.get("vocab_size")
    if isinstance(vocab, int) and vocab > vocab_size:
        raise ConfigError(
            f"{key}={path!r}: tokens go up to {vocab} but model.vocab_size="
            f"{vocab_size}; use a model with a larger vocabulary or "
            f"set model.vocab_size={vocab}"
        )
    count = meta.get("tokens")
    return count if isinstance(count, int) else None


def check_data(cfg: RootConfig) -> None:
    """Token files, blend sources and weights, the held-out split, evaluation settings."""
    d, vocab = cfg.data, cfg.model.vocab_size
    if not 0 <= d.valid_fraction < 0.5:
        raise ConfigError(
            f"data.valid_fraction={d.valid_fraction}: the held-out share of the tokens must be "
            f">= 0 and < 0.5 (0: no validation split); e.g. data.valid_fraction=0.01"
        )
    check_positive("data.valid_windows", d.valid_windows)
    if cfg.train.eval_interval < 0:
        raise ConfigError(
            f"train.eval_interval={cfg.train.eval_interval}: must be 0 (off) or a number of "
            f"steps; e.g. train.eval_interval=50"
        )
    counts: list[tuple[str, Optional[int]]] = []
    if d.kind == DataKind.tokens:
        counts.append(("data.path", _token_file("data.path", d.path, vocab)))
    if d.kind == DataKind.text:
        counts.extend(_text_counts(d, vocab))
    if d.kind == DataKind.blend:
        if not d.sources:
            raise ConfigError(
                "data.sources=[]: data=blend needs token files and weights; e.g. "
                "data.sources='[{path: a.bin, weight: 0.7}, {path: b.bin, weight: 0.3}]'"
            )
        for i, source in enumerate(d.sources):
            key = f"data.sources[{i}]"
            counts.append((f"{key}.path", _token_file(f"{key}.path", source.path, vocab)))
            if not source.weight > 0:
                raise ConfigError(
                    f"{key}.weight={source.weight}: must be > 0 (weights are normalised); "
                    f"e.g. {key}.weight=0.5"
                )
    if d.valid_path:
        _token_file("data.valid_path", d.valid_path, vocab)
    elif d.valid_fraction > 0:
        for key, count in counts:
            if count is None:
                continue
            held = -(-count * d.valid_fraction // 1)
            # (a corpus shorter than one window is the sampler's error, on the compute node)
            if held < d.seq_len + 1 <= count - held:
                raise ConfigError(
                    f"data.valid_fraction={d.valid_fraction}: holds out {int(held)} tokens of "
                    f"{key} ({count} tokens), less than one window of data.seq_len + 1 = "
                    f"{d.seq_len + 1}; raise data.valid_fraction, or set data.valid_fraction=0"
                )


def _text_counts(d: DataConfig, vocab: int) -> list[tuple[str, Optional[int]]]:
    """data=text after text_corpus.resolve: its cached token file, once a submit made it."""
    check_text_keys(d)
    if not d.text_checksum:
        raise ConfigError(
            "data.text_checksum=None: data=text not resolved; the launch flow calls "
            "slurmtrain.common.text_corpus.resolve first"
        )
    if not d.tokens_path:  # a dry run tokenizes nothing
        return []
    return [("data.path", _token_file("data.tokens_path", d.tokens_path, vocab))]


def check_text_keys(d: DataConfig) -> None:
    """data=text's own keys, before anything is read (text_corpus.resolve calls it first)."""
    if not str(d.text_field or "").strip():
        raise ConfigError(
            f"data.text_field={d.text_field!r}: names the field holding each document's text; "
            f"e.g. data.text_field=text"
        )
    if not isinstance(d.num_proc, int) or isinstance(d.num_proc, bool) or d.num_proc < 0:
        raise ConfigError(
            f"data.num_proc={d.num_proc!r}: tokenizing processes, 0 (by corpus size) or more; "
            f"e.g. data.num_proc=8"
        )


def _sidecar(meta_path: str) -> dict[str, object]:
    try:
        with open(meta_path) as f:
            meta: object = json.load(f)
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}
