"""Token sources and the deterministic sampler that resumes at exactly the next sample.

Sample order depends only on (seed, epoch), and the global batch of step `s` is samples
[skip + s*G, skip + (s+1)*G) of that order, laid out micro-step-major then rank — so the batch a
step sees is the same whatever the world size, and resuming needs nothing but the number of
consumed samples and `skip`: the samples skipped after divergences (a checkpoint's
`data_position.skipped_samples`).
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np


def stdlib_corpus(max_bytes: int) -> np.ndarray:
    """Python's own standard-library source as byte tokens: real text, present everywhere."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8).astype(np.int64)


def token_file(path: str) -> np.ndarray:
    """A memory-mapped .bin written by tools/prepare_data.py (dtype from its .json sidecar)."""
    meta = json.loads(Path(path).with_suffix(".json").read_text())
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")


def load_tokens(kind: str, path: str | None, max_bytes: int) -> np.ndarray:
    return stdlib_corpus(max_bytes) if kind == "synthetic" else token_file(str(path))


class Sampler:
    """Maps (step, micro step, rank) to sample indices; samples are non-overlapping windows."""

    def __init__(self, n_tokens: int, seq_len: int, seed: int) -> None:
        self.seq_len = seq_len
        self.num_samples = (n_tokens - 1) // seq_len
        if self.num_samples < 1:
            raise ValueError(
                f"corpus of {n_tokens} tokens is shorter than one sequence ({seq_len})"
            )
        self.seed = seed
        self.skip = 0  # samples skipped past diverged windows (rollbacks); in every checkpoint
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        return self._order

    def sample(self, global_index: int) -> int:
        epoch, pos = divmod(global_index, self.num_samples)
        return int(self.order(epoch)[pos])

    def indices(
        self, step: int, micro_step: int, rank: int, micro_batch: int, world: int, global_batch: int
    ) -> list[int]:
        first = self.skip + step * global_batch + (micro_step * world + rank) * micro_batch
        return [self.sample(first + i) for i in range(micro_batch)]


def batch(tokens: np.ndarray, sample_ids: list[int], seq_len: int) -> np.ndarray:
    """(micro_batch, seq_len + 1) int64 windows; inputs are [:, :-1], labels [:, 1:]."""
    return np.stack(
        [
            np.asarray(tokens[i * seq_len : i * seq_len + seq_len + 1], dtype=np.int64)
            for i in sample_ids
        ]
    )
