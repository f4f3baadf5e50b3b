"""tools/prepare_data.py: byte-level and local-HF-tokenizer token files the trainer can read."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.conftest import ROOT, run_cli


def _prepare(args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "prepare_data.py"), *args],
                          cwd=cwd, capture_output=True, text=True)


def test_byte_level_token_file_from_text_and_jsonl(workdir):
    (workdir / "a.txt").write_text("hello world")
    (workdir / "b.jsonl").write_text(json.dumps({"text": "ab"}) + "\n" + json.dumps({"text": "c"}) + "\n")
    done = _prepare(["--out", "t.bin", "a.txt", "b.jsonl"], workdir)
    assert done.returncode == 0, done.stderr
    meta = json.loads((workdir / "t.json").read_text())
    tokens = np.memmap(workdir / "t.bin", dtype=meta["dtype"], mode="r")
    assert list(tokens) == list(b"hello world") + [0] + list(b"ab") + [0] + list(b"c") + [0]
    assert meta["tokens"] == len(tokens) and meta["vocab_size"] == 256

    sys.path.insert(0, str(ROOT))
    from slurmtrain.compute.data import token_file

    assert list(token_file(str(workdir / "t.bin"))) == list(tokens)
    plan = run_cli(["data=tokens", f"data.path={workdir / 't.bin'}", "data.seq_len=128",
                    "dry_run=true"], cwd=workdir)
    assert plan.returncode == 0, plan.stderr


def test_local_hf_tokenizer_directory(workdir):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = workdir / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>") \
        .save_pretrained(workdir / "tok")
    done = _prepare(["--out", "t.bin", "--tokenizer", str(workdir / "tok"), str(corpus)], workdir)
    assert done.returncode == 0, done.stderr
    meta = json.loads((workdir / "t.json").read_text())
    assert meta["vocab_size"] <= 60 and meta["tokens"] > 50
