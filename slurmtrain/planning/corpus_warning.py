"""One line when a run would train on the built-in corpus more than once.

`data=synthetic` (the default) is a few MB of Python's standard library, there so the demo needs
no download; an OPT recipe's 300B tokens would read it tens of thousands of times: the plan says
so, and how to pass real data. Pure: the login node calls it with the validated config.
"""

from __future__ import annotations

from typing import Optional

from slurmtrain.common.schema import DataKind, RootConfig


def corpus_warning(cfg: RootConfig) -> Optional[str]:
    """The warning line, or None (real data, or at most one pass over the built-in corpus)."""
    d = cfg.data
    if d.kind != DataKind.synthetic:
        return None
    # One byte, one token; the held-out tail never trains (unless data.valid_path is given).
    held_out = 0.0 if d.valid_path else float(d.valid_fraction)
    corpus = int(d.max_corpus_bytes * (1 - held_out))
    steps, batch = cfg.train.max_steps or 0, cfg.train.global_batch_size or 0
    planned = int(steps) * int(batch) * int(d.seq_len)
    if corpus <= 0 or planned <= corpus:
        return None
    return (
        f"warning: data.kind=synthetic: {planned:.3g} tokens would read the built-in corpus "
        f"({corpus / 1e6:.2f}M tokens of Python's stdlib source) {planned / corpus:,.0f} epochs "
        f"over; pass real data: slurmtrain prepare-data --out corpus.bin FILES..., then "
        f"data=tokens data.path=corpus.bin (or data=blend data.sources=...)"
    )
