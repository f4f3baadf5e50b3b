"""data=text on the login node: local jsonl, parquet, text files and saved `datasets` folders are
tokenized once into a cache keyed by their content; a resubmission reuses it; bad input is one
line naming the key, the value and the fix, before anything is written or submitted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from slurmtrain.common import rundir, text_corpus
from slurmtrain.common.errors import ConfigError
from tests.conftest import ROOT
from tests.plans import composed, planned

pytestmark = pytest.mark.usefixtures("no_slurm")
DOCS = [f"def f{i}(x):\n    return x * {i}  # é" for i in range(300)]


def _jsonl(path: Path, docs: list[str] = DOCS, key: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": i, key: d}) + "\n" for i, d in enumerate(docs)))
    return path


def _parquet(path: Path, docs: list[str] = DOCS) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), path)
    return path


def _text(tmp_path: Path, *overrides: str):
    return planned(tmp_path, "data=text", "data.seq_len=16", "data.valid_fraction=0", *overrides)


def _tokens(cfg) -> np.ndarray:
    meta = json.loads(Path(cfg.data.tokens_path).with_suffix(".json").read_text())
    return np.fromfile(cfg.data.tokens_path, dtype=meta["dtype"])


def _bytes_expected(docs: list[str]) -> list[int]:
    return [t for d in docs for t in [*d.encode("utf-8"), 0]]  # byte level: EOS is 0


def test_jsonl_and_parquet_give_the_same_tokens_and_a_second_submit_reuses_the_cache(
    tmp_path, capsys
):
    first = _text(tmp_path, f"data.path={_jsonl(tmp_path / 'a.jsonl')}")
    assert "data: tokenizing" in capsys.readouterr().out
    assert _tokens(first).tolist() == _bytes_expected(DOCS)
    entry = Path(first.data.tokens_path).parent
    assert entry.parent == tmp_path / ".tokenized" and entry.name == first.data.text_checksum
    built = (entry / "tokens.bin").stat().st_mtime_ns

    again = _text(tmp_path, f"data.path={tmp_path / 'a.jsonl'}", "name=second")
    out = capsys.readouterr().out
    assert "data: reusing" in out and "tokenizing" not in out
    assert (entry / "tokens.bin").stat().st_mtime_ns == built
    assert again.data.tokens_path == first.data.tokens_path

    par = _text(tmp_path, f"data.path={_parquet(tmp_path / 'a.parquet')}", "data.num_proc=2")
    assert "2 processes" in capsys.readouterr().out  # the parallel path: shards joined in order
    assert par.data.text_checksum != first.data.text_checksum  # other input bytes
    assert (Path(par.data.tokens_path).read_bytes()) == (entry / "tokens.bin").read_bytes()
    meta = json.loads((entry / "tokens.json").read_text())
    assert (meta["documents"], meta["tokenizer"], meta["vocab_size"]) == (300, "bytes", 256)


def test_the_fingerprint_covers_the_content_not_only_the_path(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl")
    dry = composed(tmp_path, "data=text", f"data.path={path}", "data.seq_len=16", "dry_run=true")
    from slurmtrain.login.prepare import resolve

    before = resolve(dry)
    assert before.data.tokens_path is None  # a dry run tokenizes nothing ...
    assert not (tmp_path / ".tokenized" / before.data.text_checksum).exists()
    _jsonl(path, DOCS + ["one more record"])
    after = resolve(dry)  # ... but knows the run's fingerprint, which follows the content
    assert after.data.text_checksum != before.data.text_checksum
    assert rundir.fingerprint(after) != rundir.fingerprint(before)


def test_text_files_a_mixed_folder_and_a_saved_dataset(tmp_path):
    import datasets

    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("plain text file\nsecond line\n")
    _jsonl(folder / "sub" / "a.jsonl", DOCS[:3])
    cfg = _text(tmp_path, f"data.path={folder}")
    # groups by format in name order (json, then text); a .txt file is one document
    assert _tokens(cfg).tolist() == _bytes_expected([*DOCS[:3], "plain text file\nsecond line\n"])

    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": DOCS[:5], "n": list(range(5))}).save_to_disk(saved)
    before = sorted(p.name for p in saved.iterdir())
    cfg = _text(tmp_path, f"data.path={saved}", "data.text_field=body")
    assert _tokens(cfg).tolist() == _bytes_expected(DOCS[:5])
    assert sorted(p.name for p in saved.iterdir()) == before  # no cache files written into it


def test_the_model_folders_tokenizer_is_chosen_and_must_fit_the_vocabulary(tmp_path):
    folder = tmp_path / "model"  # model=hf model.config=model/config.json, a tokenizer beside it
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    model = SimpleNamespace(config=str(folder / "config.json"), pretrained_path=None)
    cfg = SimpleNamespace(model=model, data=SimpleNamespace(tokenizer=None))
    assert text_corpus.tokenizer_folder(cfg) == folder.resolve()
    cfg.data.tokenizer = "bytes"
    assert text_corpus.tokenizer_folder(cfg) is None
    model.config, cfg.data.tokenizer = None, None  # no model folder: bytes
    assert text_corpus.tokenizer_folder(cfg) is None
    # (a real tokenizer end to end: tests/local/test_text_data.py)
    with pytest.raises(ConfigError, match=r"data.tokenizer=bytes .*model.vocab_size=128; use"):
        _text(tmp_path, f"data.path={_jsonl(tmp_path / 't.jsonl')}", "model.vocab_size=128")


@pytest.mark.parametrize(
    "make, overrides, match",
    [
        (None, ["data.path=nowhere.jsonl"], r"data.path=nowhere.jsonl: no such file"),
        ("x.csv", [], r"unsupported file type '.csv'"),
        ("empty_dir", [], r"a folder with no .jsonl"),
        ("x.jsonl", ["data.text_field=body"], r"data.text_field=body: .* has no such field"),
        ("x.parquet", ["data.text_field=body"], r"data.text_field=body: .* has no such field"),
        ("blank.jsonl", [], r"no text \(300 records, all empty"),
        ("x.jsonl", ["data.text_field=id"], r"data.text_field=id: .* not text"),
        ("x.jsonl", ["data.num_proc=-1"], r"data.num_proc=-1: "),
        ("x.jsonl", ["data.tokenizer=nowhere"], r"data.tokenizer=nowhere: not a local tokenizer"),
    ],
)
def test_bad_input_is_one_line_naming_the_key_and_nothing_is_cached(
    tmp_path, make, overrides, match
):
    path = tmp_path / (make or "unused")
    if make == "empty_dir":
        path.mkdir()
    elif make == "x.csv":
        path.write_text("text\nhello\n")
    elif make == "blank.jsonl":
        _jsonl(path, [""] * 300)
    elif make == "x.jsonl":
        _jsonl(path)
    elif make == "x.parquet":
        _parquet(path)
    with pytest.raises(ConfigError, match=match) as err:
        _text(tmp_path, *([f"data.path={path}"] if make else []), *overrides)
    assert "\n" not in str(err.value)
    assert not list((tmp_path / ".tokenized").glob("*/tokens.bin"))
    assert not list(tmp_path.glob("*/*/config.yaml"))  # no run directory


def test_the_login_side_imports_no_datasets_or_transformers_until_asked():
    code = (
        "import sys, slurmtrain.login.prepare, slurmtrain.common.text_corpus; "
        "print(sorted({'datasets', 'transformers', 'torch', 'pyarrow'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
