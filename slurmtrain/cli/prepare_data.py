"""`slurmtrain prepare-data`: text or JSONL files -> one memory-mapped token file for
`data=tokens data.path=OUT.bin`.

    slurmtrain prepare-data --out corpus.bin [--tokenizer HF_DIR] [--text-key text]
                            [--vocab-size 50272] [--workers N] FILES...

Work is split over files, and large JSONL files into line-aligned chunks, and tokenized by a pool
of processes (one per core by default); parts are concatenated in input order, so the output is the
same whatever the number of workers. A rich progress bar counts input bytes.

With `--tokenizer`, a local Hugging Face tokenizer folder encodes the text (transformers
AutoTokenizer, local files only: nothing is downloaded) and a copy of it is saved beside the output
(`OUT.tokenizer/`), so training, `sample` and `export` decode with it; without it, UTF-8 bytes are
the tokens (vocabulary 256, what `model=opt_tiny` expects). Every document ends with the end-of-
document id (the tokenizer's EOS; byte level: 0). The sidecar `OUT.json` records dtype, token count,
vocab_size and the tokenizer (its source path and the copy). A tokenizer whose vocabulary does not
fit the model's embedding (`--vocab-size`) is refused before any work.

Or skip this step: `data=text data.path=FILES_OR_DIR` reads jsonl, parquet, text files and saved
`datasets` folders and tokenizes them at submit into a cache keyed by their content
(slurmtrain/common/text_corpus.py); this command stays for a token file made once and shared.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, cast

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

CHUNK_BYTES = 32 << 20  # JSONL files larger than this are split into line-aligned chunks
_TOK: Any = None  # the worker's tokenizer (loaded once per process)


def _fail(line: str) -> int:
    print(f"prepare-data: {line}", file=sys.stderr)
    return 2


def work_units(paths: list[Path], chunk: int = CHUNK_BYTES) -> list[tuple[str, int, int]]:
    """(path, start, end) byte ranges: whole text files, JSONL split at line starts."""
    units = []
    for path in paths:
        size = path.stat().st_size
        if path.suffix not in (".jsonl", ".json") or size <= chunk:
            units.append((str(path), 0, size))
            continue
        with open(path, "rb") as f:
            start = 0
            while start < size:
                f.seek(min(start + chunk, size))
                f.readline()  # to the end of the line the cut fell into
                end = min(f.tell(), size) if start + chunk < size else size
                units.append((str(path), start, end))
                start = end
    return units


def documents(path: str, start: int, end: int, key: str) -> Iterator[str]:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if not path.endswith((".jsonl", ".json")):
        yield data.decode("utf-8", errors="replace")
        return
    for line in data.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if key not in row:
            raise KeyError(
                f"{path}: a line near byte {start} has no key {key!r} (keys: "
                f"{', '.join(list(row)[:5])}); pass --text-key"
            )
        yield row[key]


def _init(tokenizer: Optional[str]) -> None:
    global _TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if tokenizer and _TOK is None:  # forked workers inherit the parent's
        from transformers import AutoTokenizer

        _TOK = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)


def _encode(text: str) -> list[int]:
    if _TOK is None:
        return list(text.encode("utf-8"))
    return cast(list[int], _TOK(text, add_special_tokens=False)["input_ids"])  # untyped library


def tokenize_unit(job: tuple[int, str, int, int, str, int, str, str]) -> tuple[int, int, int, int]:
    """One unit -> `part_file`; returns (index, tokens, documents, input bytes)."""
    index, path, start, end, key, eos, dtype, part = job
    tokens = docs = 0
    with open(part, "wb") as out:
        for text in documents(path, start, end, key):
            ids = np.asarray(_encode(text) + [eos], dtype=dtype)
            out.write(ids.tobytes())
            tokens += len(ids)
            docs += 1
    return index, tokens, docs, end - start


def load_tokenizer(folder: str) -> tuple[Any, int, int]:
    """(tokenizer, vocabulary size, end-of-document id)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    return tok, len(tok), 0 if eos is None else int(eos)


EXAMPLE = "example: slurmtrain prepare-data --out data/licenses.bin /usr/share/common-licenses/*"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmtrain prepare-data",
        description="Text or JSONL files -> one memory-mapped token file for "
        "data=tokens data.path=OUT.bin (or skip it: data=text data.path=FILES_OR_DIR).",
        epilog=EXAMPLE,
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokenizer", help="local Hugging Face tokenizer folder (default: bytes)")
    parser.add_argument(
        "--text-key",
        "--jsonl-key",
        dest="text_key",
        default="text",
        help="the JSONL field holding each document's text",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=50272,
        help="the model's embedding rows (model.vocab_size): the tokenizer must fit",
    )
    parser.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    parser.add_argument(
        "--chunk-bytes",
        type=int,
        default=CHUNK_BYTES,
        help="split JSONL files larger than this into line-aligned work units",
    )
    return parser


def _tokenizer(args: argparse.Namespace) -> tuple[Any, int, int, str] | str:
    """(tokenizer or None, vocabulary, end-of-document id, its name), or the refusal's line."""
    if not args.tokenizer:
        tok, vocab, eos, name = None, 256, 0, "bytes"
    elif not Path(args.tokenizer).is_dir():
        return (
            f"--tokenizer={args.tokenizer}: not a directory; pass a local Hugging "
            f"Face tokenizer folder (tokenizer.json, tokenizer_config.json)"
        )
    else:
        try:
            tok, vocab, eos = load_tokenizer(args.tokenizer)
        except (OSError, ValueError) as err:
            return f"--tokenizer={args.tokenizer}: cannot load it ({err})"
        name = os.path.abspath(args.tokenizer)
    if vocab > args.vocab_size:
        what = f"--tokenizer={args.tokenizer}" if args.tokenizer else "the byte-level tokenizer"
        return (
            f"{what} has {vocab} tokens but the model's embedding "
            f"has --vocab-size={args.vocab_size}; use a model with model.vocab_size >= "
            f"{vocab} (and pass it here) or a smaller tokenizer"
        )
    return tok, vocab, eos, name


Job = tuple[int, str, int, int, str, int, str, str]


def _tokenize(
    args: argparse.Namespace, jobs: list[Job], workers: int
) -> dict[int, tuple[int, int]]:
    """Every job's part file written by the pool; {index: (tokens, documents)}."""
    results: dict[int, tuple[int, int]] = {}
    columns = [TextColumn("tokenizing"), BarColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
    with (
        Progress(*columns, transient=True) as bar,
        mp.get_context("fork").Pool(max(1, workers), _init, (args.tokenizer,)) as pool,
    ):
        task = bar.add_task("tokenizing", total=sum(job[3] - job[2] for job in jobs))
        for index, tokens, docs, nbytes in pool.imap_unordered(tokenize_unit, jobs):
            results[index] = (tokens, docs)
            bar.advance(task, nbytes)
    return results


def _join(out: Path, jobs: list[Job]) -> None:
    """The parts, in input order, into OUT (renamed into place when whole)."""
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as dest:
        for job in jobs:
            with open(job[-1], "rb") as part:
                shutil.copyfileobj(part, dest, 16 << 20)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    global _TOK
    args = build_parser().parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before the tokenizer runs: fork-safe
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        return _fail(f"no such file: {', '.join(missing)}")
    chosen = _tokenizer(args)
    if isinstance(chosen, str):
        return _fail(chosen)
    tok, vocab, eos, name = chosen
    _TOK = tok
    dtype = np.dtype(np.uint16 if vocab <= 65535 else np.uint32)
    units = work_units(args.files, max(1, args.chunk_bytes))
    workers = args.workers or min(len(units), os.cpu_count() or 1)
    parts = args.out.with_name(args.out.name + ".parts")
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    jobs = [
        (i, path, start, end, args.text_key, eos, dtype.name, str(parts / f"{i:06d}.bin"))
        for i, (path, start, end) in enumerate(units)
    ]
    try:
        results = _tokenize(args, jobs, workers)
    except (KeyError, json.JSONDecodeError, UnicodeDecodeError) as err:
        shutil.rmtree(parts, ignore_errors=True)
        return _fail(str(err).strip("'\""))
    _join(args.out, jobs)
    shutil.rmtree(parts, ignore_errors=True)
    count = sum(t for t, _ in results.values())
    meta = {
        "dtype": dtype.name,
        "tokens": count,
        "documents": sum(d for _, d in results.values()),
        "vocab_size": vocab,
        "eos_id": eos,
        "tokenizer": name,
        "sources": [str(p) for p in args.files],
    }
    if tok is not None:
        copy = args.out.with_name(args.out.stem + ".tokenizer")
        shutil.rmtree(copy, ignore_errors=True)
        tok.save_pretrained(str(copy))
        meta["tokenizer_dir"] = copy.name  # relative to the sidecar: moves with the data
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    print(
        f"prepare-data: {count:,} tokens, {meta['documents']:,} documents (vocab {vocab}, "
        f"{dtype.name}, {workers} workers) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
