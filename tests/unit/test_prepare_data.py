"""tools/prepare_data.py: byte-level and local-HF-tokenizer token files the trainer can read."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.conftest import ROOT, run_cli


def _prepare(args, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "prepare_data.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def test_byte_level_token_file_from_text_and_jsonl(workdir):
    (workdir / "a.txt").write_text("hello world")
    (workdir / "b.jsonl").write_text(
        json.dumps({"text": "ab"}) + "\n" + json.dumps({"text": "c"}) + "\n"
    )
    done = _prepare(["--out", "t.bin", "a.txt", "b.jsonl"], workdir)
    assert done.returncode == 0, done.stderr
    meta = json.loads((workdir / "t.json").read_text())
    tokens = np.memmap(workdir / "t.bin", dtype=meta["dtype"], mode="r")
    assert list(tokens) == list(b"hello world") + [0] + list(b"ab") + [0] + list(b"c") + [0]
    assert meta["tokens"] == len(tokens) and meta["vocab_size"] == 256

    sys.path.insert(0, str(ROOT))
    from slurmtrain.compute.data import token_file

    assert list(token_file(str(workdir / "t.bin"))) == list(tokens)
    plan = run_cli(
        ["data=tokens", f"data.path={workdir / 't.bin'}", "data.seq_len=128", "dry_run=true"],
        cwd=workdir,
    )
    assert plan.returncode == 0, plan.stderr


def test_local_hf_tokenizer_directory(workdir):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = workdir / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"]))
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(workdir / "tok")
    done = _prepare(["--out", "t.bin", "--tokenizer", str(workdir / "tok"), str(corpus)], workdir)
    assert done.returncode == 0, done.stderr
    meta = json.loads((workdir / "t.json").read_text())
    assert meta["vocab_size"] <= 60 and meta["tokens"] > 50


def _tiny_tokenizer(workdir, vocab=60):
    """A BPE trained on a few strings, saved as a transformers folder (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = workdir / "train.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n" * 20 + "the quick brown fox\n" * 20)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train(
        [str(corpus)], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "</s>"])
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(workdir / "tok")
    return workdir / "tok"


def test_jsonl_with_text_key_and_tokenizer_folder_in_parallel_chunks(workdir):
    from transformers import AutoTokenizer

    folder = _tiny_tokenizer(workdir)
    docs = [f"def add(a, b): return a + b  # {i}" for i in range(300)]
    (workdir / "a.jsonl").write_text(
        "".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs[:200]))
    )
    (workdir / "b.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs[200:]))
    sys.path.insert(0, str(ROOT / "tools"))
    import prepare_data

    units = prepare_data.work_units([workdir / "a.jsonl"], chunk=1000)  # line-aligned chunks
    assert (
        len(units) > 3 and units[0][1] == 0 and units[-1][2] == (workdir / "a.jsonl").stat().st_size
    )
    assert all(a[2] == b[1] for a, b in zip(units, units[1:]))
    done = _prepare(
        [
            "--out",
            "t.bin",
            "--tokenizer",
            str(folder),
            "--text-key",
            "body",
            "--workers",
            "2",
            "--chunk-bytes",
            "1000",
            "a.jsonl",
            "b.jsonl",
        ],
        workdir,
    )
    assert done.returncode == 0, done.stderr
    meta = json.loads((workdir / "t.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(workdir / meta["tokenizer_dir"]), local_files_only=True)
    eos = tok.eos_token_id
    want = [t for d in docs for t in tok(d, add_special_tokens=False)["input_ids"] + [eos]]
    tokens = np.memmap(workdir / "t.bin", dtype=meta["dtype"], mode="r")
    assert list(tokens) == want and meta["documents"] == 300 and meta["eos_id"] == eos
    assert meta["vocab_size"] == len(tok) and meta["tokenizer"] == str(folder)

    missing_key = _prepare(["--out", "u.bin", "--text-key", "text", "a.jsonl"], workdir)
    assert missing_key.returncode == 2 and "--text-key" in missing_key.stderr


def test_tokenizer_larger_than_the_embedding_is_refused_in_one_line(workdir):
    folder = _tiny_tokenizer(workdir)
    (workdir / "a.txt").write_text("hello")
    done = _prepare(
        ["--out", "t.bin", "--tokenizer", str(folder), "--vocab-size", "32", "a.txt"], workdir
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
    assert f"has {size} tokens" in lines[0] and "--vocab-size=32" in lines[0], lines[0]
    assert not (workdir / "t.bin").exists()
