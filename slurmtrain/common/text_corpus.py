"""`data=text data.path=FILE_OR_DIR`: local text tokenized once, at submit, into a cached token file.

Login node (login/prepare.py resolve), before the plan: data.path is listed (.jsonl/.json,
.parquet, .txt/.md files, a folder of them, or a `datasets` save_to_disk folder), its text field
checked on the first record, the tokenizer chosen (data.tokenizer; else model.config's or
model.pretrained_path's folder when it holds a tokenizer; else UTF-8 bytes) and checked against
model.vocab_size. The corpus's identity, data.text_checksum, hashes the input files' bytes (their
digests are cached by path, size, mtime and inode, so a resubmission reads nothing again), the
tokenizer's files and the text field: it is a result key, so the run's fingerprint covers the
content, not the path. A submit (not a dry run) then finds or builds CACHE/<checksum>/tokens.bin
with the tokens.json sidecar that data=tokens files have, and records it as data.tokens_path: the
compute side memory-maps it exactly as it does data.path for data=tokens, and resumes from it the
same way. CACHE is data.cache_dir, by default RUNS_ROOT/.tokenized, which compute nodes can read.

Tokenizing uses `datasets` (imported only here, only when data=text is asked for; offline: nothing
is downloaded): its map shows a progress bar and, over DEFAULT_PARALLEL_BYTES, runs one process per
core (data.num_proc); its shards are joined in order, so the tokens do not depend on the number of
processes. Every document ends with the end-of-document id (the tokenizer's EOS; bytes: 0), as
`slurmtrain prepare-data` writes them; a .txt/.md file is one document. The entry is built in a
private folder and renamed into place, so a killed submit leaves no half-written cache and two
submits racing both end up reading one complete entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import DataKind, RootConfig
from slurmtrain.common.text_tokenize import Corpus, build_entry, no_field

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".md": "text"}
# Files a Hugging Face tokenizer folder is made of: its identity in the checksum.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "*.model")  # fmt: skip
LAYOUT = 1  # bump when the token layout changes: entries of another layout are not reused
BYTES = "bytes"
EXAMPLE = "e.g. data.path=corpus.jsonl (.jsonl, .parquet, .txt, a folder of them, or a `datasets` "
EXAMPLE += "save_to_disk folder)"


def find(path: Optional[str]) -> Corpus:
    """data.path -> its input files; every refusal is one line naming the key and the fix."""
    if not path:
        raise ConfigError(f"data.path=None: data=text needs local text; {EXAMPLE}")
    root = Path(os.path.expanduser(path)).resolve()
    if root.is_dir():
        if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
            files = sorted(p for p in root.rglob("*") if p.is_file())
            return Corpus(root, [("disk", files)], saved=True)
        found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in FORMATS)
        if not found:
            raise ConfigError(
                f"data.path={path}: a folder with no {', '.join(FORMATS)} files and no saved "
                f"dataset; put the corpus's files there or point at one; {EXAMPLE}"
            )
        builders = sorted({FORMATS[p.suffix] for p in found})
        return Corpus(root, [(b, [p for p in found if FORMATS[p.suffix] == b]) for b in builders])
    if not root.is_file():
        raise ConfigError(f"data.path={path}: no such file or folder; {EXAMPLE}")
    if root.suffix not in FORMATS:
        raise ConfigError(
            f"data.path={path}: unsupported file type {root.suffix or '(none)'!r}; data=text "
            f"reads {', '.join(FORMATS)}; convert it, or {EXAMPLE}"
        )
    return Corpus(root, [(FORMATS[root.suffix], [root])])


def first_columns(builder: str, path: Path) -> Optional[list[str]]:
    """The first record's fields, read cheaply (no `datasets`); None where not known this way."""
    if builder == "json" and path.suffix == ".jsonl":
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    return list(row) if isinstance(row, dict) else []
        return None
    if builder == "parquet":
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # a dependency of datasets

        return list(pq.read_schema(path).names)
    return None


def check_field(corpus: Corpus, text_field: str) -> None:
    """A missing text field is refused before anything is hashed or tokenized."""
    for builder, files in corpus.groups:
        try:
            columns = first_columns(builder, files[0]) if files else None
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"data.path={files[0]}: cannot read it as {builder} ({err}); fix or remove the file"
            ) from None
        if columns is not None and text_field not in columns:
            raise ConfigError(no_field(files[0], text_field, columns))


def tokenizer_folder(cfg: RootConfig) -> Optional[Path]:
    """data.tokenizer, or the model folder's tokenizer, or None (UTF-8 bytes)."""
    asked = cfg.data.tokenizer
    if asked == BYTES:
        return None
    if asked:
        folder = Path(os.path.expanduser(asked)).resolve()
        if not tokenizer_files(folder):
            raise ConfigError(
                f"data.tokenizer={asked}: not a local tokenizer folder (tokenizer.json or "
                f"tokenizer_config.json); pass a Hugging Face model folder or data.tokenizer=bytes"
            )
        return folder
    m = cfg.model
    candidates = [Path(m.config).parent if m.config else None]
    candidates.append(Path(m.pretrained_path) if m.pretrained_path else None)
    return next((c.resolve() for c in candidates if c and tokenizer_files(c)), None)


def tokenizer_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = sorted({p for pattern in TOKENIZER_FILES for p in folder.glob(pattern)})
    return found if any(p.name.startswith("tokenizer") for p in found) else []


def load_tokenizer(folder: Optional[Path]) -> tuple[Any, int, int]:
    """(tokenizer or None for bytes, vocabulary size, end-of-document id)."""
    if folder is None:
        return None, 256, 0
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"data.tokenizer={folder}: cannot load it ({err}); pass another folder or "
            f"data.tokenizer=bytes"
        ) from None
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    return tok, len(tok), 0 if eos is None else int(eos)


def check_vocab(cfg: RootConfig, folder: Optional[Path], vocab: int) -> None:
    if vocab <= cfg.model.vocab_size:
        return
    what = f"data.tokenizer={folder}" if folder else "data.tokenizer=bytes (no model tokenizer)"
    raise ConfigError(
        f"{what}: has {vocab} tokens but model.vocab_size={cfg.model.vocab_size}; use a model "
        f"whose embedding holds them (model.vocab_size={vocab}) or a smaller tokenizer"
    )


def digest(path: Path, cache: dict[str, str]) -> str:
    """SHA-256 of a file's bytes, cached by path, size, mtime and inode."""
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    if key not in cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
        cache[key] = h.hexdigest()
    return cache[key]


def checksum(corpus: Corpus, text_field: str, tok_dir: Optional[Path], cache_root: Path) -> str:
    """The corpus's identity: input bytes in order, the tokenizer's files, the text field."""
    digests_file = cache_root / "digests.json"
    try:
        read: object = json.loads(digests_file.read_text())
    except (OSError, ValueError):
        read = {}
    cache = (
        {str(k): v for k, v in read.items() if isinstance(v, str)} if isinstance(read, dict) else {}
    )
    h = hashlib.sha256(f"layout {LAYOUT}\nfield {text_field}\n".encode())
    for builder, files in corpus.groups:
        for path in files:
            # a saved dataset's file names say which arrow file is which; plain inputs are only
            # their bytes, in order (a moved or renamed corpus keeps its identity)
            name = str(path.relative_to(corpus.root)) if corpus.saved else ""
            h.update(f"{builder} {name} {digest(path, cache)}\n".encode())
    for path in tokenizer_files(tok_dir) if tok_dir else []:
        h.update(f"tokenizer {path.name} {digest(path, cache)}\n".encode())
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        tmp = digests_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(digests_file)
    except OSError:
        pass  # a digest cache that cannot be written only costs time
    return h.hexdigest()[:16]


def cache_root(cfg: RootConfig) -> Path:
    base = cfg.data.cache_dir or os.path.join(str(cfg.runs_root), ".tokenized")
    return Path(os.path.expanduser(base)).resolve()


def resolve(cfg: RootConfig, build: bool = True) -> None:
    """data=text: checked, its checksum recorded (fingerprinted), and at submit (`build`) its
    cached token file found or made and recorded as data.tokens_path."""
    d = cfg.data
    if d.kind != DataKind.text:
        return
    from slurmtrain.common.validation_data import check_text_keys

    check_text_keys(d)
    corpus = find(d.path)
    d.path = str(corpus.root)
    check_field(corpus, d.text_field)
    tok_dir = tokenizer_folder(cfg)
    root = cache_root(cfg)
    d.text_checksum = checksum(corpus, d.text_field, tok_dir, root)
    entry = root / d.text_checksum
    meta = cached(entry)
    if meta is not None:  # its vocabulary is recorded: no tokenizer (no transformers) loaded
        check_vocab(cfg, tok_dir, int(meta["vocab_size"]))
        print(f"data: reusing tokenized {corpus.root.name} ({d.text_checksum}) from {entry}")
    else:
        tok, vocab, eos = load_tokenizer(tok_dir)
        check_vocab(cfg, tok_dir, vocab)
        if not build:
            return  # a dry run: nothing is tokenized, the fingerprint is already known
        build_entry(corpus, d, (tok, tok_dir, vocab, eos), entry)
    d.tokens_path = str(entry / "tokens.bin")


def cached(entry: Path) -> Optional[dict[str, Any]]:
    """A complete cache entry's sidecar (written last, after its tokens), or None."""
    try:
        meta: object = json.loads((entry / "tokens.json").read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and isinstance(meta.get("vocab_size"), int)
    return meta if ok and (entry / "tokens.bin").is_file() else None  # type: ignore[return-value]
