"""The headline on the built-in corpus warns in one line."""

from __future__ import annotations

from slurmtrain.planning.corpus_warning import corpus_warning
from tests.unit.test_recipes_placement import _cfg


def test_opt13b_on_the_built_in_corpus_says_how_many_epochs_and_how_to_pass_data():
    cfg = _cfg("model=opt13b")  # the headline's recipe: 300B tokens, 4M-token batches
    line = corpus_warning(cfg)
    assert line is not None and "\n" not in line
    # 71,525 steps x 2,048 x 2,048 tokens over 99% of 4,000,000 byte tokens
    assert "75,757 epochs" in line and "data.kind=synthetic" in line
    assert "data=tokens data.path=" in line and "slurmtrain prepare-data" in line


def test_no_warning_within_one_epoch_or_on_real_data():
    assert corpus_warning(_cfg()) is None  # the tiny demo: 200 x 8 x 128 tokens, 5% of it
    real = _cfg("model=opt13b")
    real.data.kind = "tokens"  # as data=tokens data.path=FILE.bin resolves (the file checked)
    assert corpus_warning(real) is None
    shorter = _cfg("model=opt125m", "train.max_steps=2", "data.seq_len=128")
    assert corpus_warning(shorter) is None
