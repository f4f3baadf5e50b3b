"""Text or JSONL files -> one memory-mapped token file for `data=tokens data.path=OUT.bin`.

    python tools/prepare_data.py --out corpus.bin [--tokenizer HF_DIR] [--jsonl-key text] FILES...

With `--tokenizer`, a local Hugging Face tokenizer directory encodes the text (nothing downloaded);
without it, UTF-8 bytes are the tokens (vocabulary 256, what `model=opt_tiny` expects). Documents
are separated by the tokenizer's EOS id (byte level: 0). A JSON sidecar records dtype and vocab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
from rich.progress import Progress


def documents(paths: list[Path], key: str) -> Iterator[str]:
    for path in paths:
        if path.suffix in (".jsonl", ".json"):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield json.loads(line)[key]
        else:
            yield path.read_text(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokenizer", help="local Hugging Face tokenizer directory")
    parser.add_argument("--jsonl-key", default="text")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        print(f"prepare_data: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        vocab, eos = len(tok), tok.eos_token_id if tok.eos_token_id is not None else 0
        encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        name = os.path.abspath(args.tokenizer)
    else:
        vocab, eos, name = 256, 0, "bytes"
        encode = lambda text: list(text.encode("utf-8"))  # noqa: E731
    dtype = np.uint16 if vocab <= 65535 else np.uint32
    tmp = args.out.with_name(args.out.name + ".tmp")
    count = 0
    total_bytes = sum(p.stat().st_size for p in args.files)
    with open(tmp, "wb") as out, Progress(transient=True) as bar:
        task = bar.add_task("tokenizing", total=total_bytes)
        for text in documents(args.files, args.jsonl_key):
            ids = np.asarray(encode(text) + [eos], dtype=dtype)
            out.write(ids.tobytes())
            count += len(ids)
            bar.advance(task, len(text.encode("utf-8")))
    os.replace(tmp, args.out)
    meta = {"dtype": np.dtype(dtype).name, "tokens": count, "vocab_size": vocab,
            "tokenizer": name, "sources": [str(p) for p in args.files]}
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    print(f"prepare_data: {count:,} tokens (vocab {vocab}, {np.dtype(dtype).name}) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
