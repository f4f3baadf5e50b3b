"""data=text's one tokenizing pass: local files -> `datasets` -> CACHE/<checksum>/tokens.bin.

text_corpus.resolve calls `build_entry` at submit when the cache has no entry for the corpus's
checksum. `datasets` reads the files (offline; its own arrow cache goes into the entry's private
build folder and is deleted, so a user's saved dataset folder and ~/.cache stay untouched), `map`
tokenizes with a progress bar in data.num_proc processes (its shards are joined in order: the same
tokens whatever the number), and the ids are streamed into the .bin with the sidecar data=tokens
files have (dtype, tokens, documents, vocab_size, eos_id, tokenizer, tokenizer_dir).
Every login imports this module (through text_corpus): numpy and `datasets` only inside functions.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import DataConfig

DEFAULT_PARALLEL_BYTES = 64 << 20  # below this, one process (starting a pool costs seconds)
MAX_PROCS = 16  # a login node is shared
MAP_BATCH = 1000  # documents per tokenizer call
TokInfo = tuple[Any, Optional[Path], int, int]  # (tokenizer or None, its folder, vocab, eos id)


@dataclass
class Corpus:
    """What data.path holds: (builder, files) groups in a fixed order, or a saved dataset."""

    root: Path
    groups: list[tuple[str, list[Path]]] = field(default_factory=list)
    saved: bool = False  # a `datasets` save_to_disk folder (load_from_disk)

    @property
    def files(self) -> list[Path]:
        return [f for _, files in self.groups for f in files]


def no_field(where: object, text_field: str, columns: list[str]) -> str:
    return (
        f"data.text_field={text_field}: {where} has no such field (it has "
        f"{', '.join(columns[:8]) or 'none'}); set data.text_field=NAME of the field with the text"
    )


def workers(asked: int, corpus: Corpus) -> int:
    """data.num_proc, or by size: one process for small corpora, one per core for big ones."""
    if asked > 0:
        return asked
    size = sum(p.stat().st_size for p in corpus.files)
    return 1 if size < DEFAULT_PARALLEL_BYTES else min(os.cpu_count() or 1, MAX_PROCS)


def encode_batch(batch: dict[str, list[Any]], tok: Any, eos: int) -> dict[str, list[Any]]:
    """A batch of documents -> their ids, each ended by the end-of-document id (map's worker)."""
    import numpy as np

    texts = [t if isinstance(t, str) else "" for t in batch["doc"]]
    if tok is None:  # bytes: the end-of-document id is 0
        return {"ids": [np.frombuffer(t.encode("utf-8") + b"\0", dtype=np.uint8) for t in texts]}
    rows = tok(texts, add_special_tokens=False)["input_ids"]
    return {"ids": [[*row, eos] for row in rows]}


def _datasets() -> Any:
    """`datasets`, offline and quiet (its loading bars; the tokenizing bar is turned on)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # map forks workers: the Rust pool would hang
    import datasets  # type: ignore[import-untyped]

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def text_column(ds: Any, text_field: str, where: object) -> Any:
    """One column of strings named `doc`; a missing or non-text field is refused in one line."""
    if text_field not in ds.column_names:
        raise ConfigError(no_field(where, text_field, list(ds.column_names)))
    kind = getattr(ds.features[text_field], "dtype", None)
    if kind not in ("string", "large_string"):
        raise ConfigError(
            f"data.text_field={text_field}: {where} holds {ds.features[text_field]} there, not "
            f"text; set data.text_field=NAME of the field with the text"
        )
    ds = ds.select_columns([text_field])
    return ds if text_field == "doc" else ds.rename_column(text_field, "doc")


def load_corpus(corpus: Corpus, text_field: str, hf_cache: Path) -> Any:
    """Every record of the corpus, in order, as one `doc` column."""
    datasets = _datasets()
    if corpus.saved:
        ds = datasets.load_from_disk(str(corpus.root))
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds and len(ds) != 1:
                raise ConfigError(
                    f"data.path={corpus.root}: a saved DatasetDict with splits {', '.join(ds)} "
                    f"and none named train; save the split to train on alone (ds[NAME].save_to_disk)"
                )
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        return text_column(ds, text_field, corpus.root)
    parts = []
    for builder, files in corpus.groups:
        extra = {"sample_by": "document"} if builder == "text" else {}
        try:
            ds = datasets.load_dataset(
                builder,
                data_files=[str(f) for f in files],
                split="train",
                cache_dir=str(hf_cache),
                **extra,
            )
        except Exception as err:  # datasets raises many types for a malformed file
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"data.path={corpus.root}: cannot read its {builder} files ({reason}); fix or "
                f"remove the bad file"
            ) from None
        column = "text" if builder == "text" else text_field  # the text builder's own column
        parts.append(text_column(ds, column, files[0] if len(files) == 1 else corpus.root))
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def write_tokens(ds: Any, tok: TokInfo, procs: int, work: Path) -> dict[str, Any]:
    """Tokenize (progress bar, `procs` processes) and stream the ids into work/tokens.bin."""
    import numpy as np

    datasets = _datasets()
    encoder, _, vocab, eos = tok
    dtype = np.dtype(np.uint16 if vocab <= 65535 else np.uint32)
    datasets.enable_progress_bars()
    ids = ds.map(
        partial(encode_batch, tok=encoder, eos=eos),
        batched=True,
        batch_size=MAP_BATCH,
        num_proc=procs if procs > 1 else None,
        remove_columns=["doc"],
        features=datasets.Features({"ids": datasets.List(datasets.Value(dtype.name))}),
        cache_file_name=str(work / "hf" / "ids.arrow"),
        desc="data: tokenizing",
    )
    datasets.disable_progress_bars()
    tokens = docs = 0
    with open(work / "tokens.bin", "wb") as out:
        for table in ids.with_format("arrow").iter(batch_size=65536):
            for chunk in table.column("ids").chunks:
                values = chunk.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
                out.write(values.tobytes())
                tokens += len(values)
            docs += table.num_rows
    return {"dtype": dtype.name, "tokens": tokens, "documents": docs}


def build_entry(corpus: Corpus, d: DataConfig, tok: TokInfo, entry: Path) -> None:
    """Tokenize the corpus into `entry` (tokens.bin, tokens.json, tokens.tokenizer/)."""
    encoder, tok_dir, vocab, eos = tok
    procs = workers(int(d.num_proc), corpus)
    size = sum(p.stat().st_size for p in corpus.files)
    print(
        f"data: tokenizing {corpus.root} ({len(corpus.files)} files, {size / 1e6:,.1f} MB) with "
        f"{tok_dir or 'bytes'} in {procs} process{'es' if procs > 1 else ''} -> {entry}",
        flush=True,
    )
    # private to this process on this host: login nodes share the cache's filesystem
    work = entry.with_name(f"{entry.name}.build-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    (work / "hf").mkdir(parents=True)
    start = time.monotonic()
    try:
        meta = write_tokens(load_corpus(corpus, str(d.text_field), work / "hf"), tok, procs, work)
        if meta["documents"] == 0 or meta["tokens"] == meta["documents"]:
            raise ConfigError(
                f"data.path={corpus.root}: no text ({meta['documents']} records, all empty "
                f"in data.text_field={d.text_field}); point data.path at the corpus"
            )
        meta.update(vocab_size=vocab, eos_id=eos, tokenizer=str(tok_dir or "bytes"))
        meta.update(sources=[str(corpus.root)], text_field=d.text_field)
        meta.update(text_checksum=d.text_checksum, seconds=round(time.monotonic() - start, 2))
        if encoder is not None:  # sample/export decode with the copy, as with prepare-data
            encoder.save_pretrained(str(work / "tokens.tokenizer"))
            meta["tokenizer_dir"] = "tokens.tokenizer"
        shutil.rmtree(work / "hf")
        (work / "tokens.json").write_text(json.dumps(meta, indent=1))
        publish(work, entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"data: {meta['tokens']:,} tokens, {meta['documents']:,} documents in "
        f"{meta['seconds']:.1f} s (cached: a resubmission reuses them)",
        flush=True,
    )


def publish(work: Path, entry: Path) -> None:
    """Rename the finished build into place; a racing submit that finished first wins."""
    try:
        os.rename(work, entry)
    except OSError:
        if not (entry / "tokens.json").is_file():
            raise
