"""Token sources, the held-out split, blends, and the deterministic sampler that resumes exactly.

Sample order depends only on (seed, epoch); the global batch of step `s` is samples
[skip + s*G, skip + (s+1)*G) of it, laid out micro-step-major then rank, so a step sees the same
batch whatever the world size and a resume needs only the consumed samples and `skip` (samples
skipped after divergences, plus a branch's `data.skip_samples`, checkpoint/select.py branch_point).

Held-out data: `data.valid_fraction` cuts the last fraction of every source before any window is
formed (no training window shares a token with a validation one), or `data.valid_path` is a
separate file. Validation uses `data.valid_windows` fixed windows evenly spaced over it, each rank
evaluating `ids[rank::world]`. Under tensor or sequence parallelism "rank" and "world" here are
the data-parallel rank and size (compute/parallel.py): the ranks of a TP or SP group read the same
samples (an SP rank then takes its slice of each window: parallel.local_slice).

Blends: sample g comes from source `schedule[g % PERIOD]`, a fixed greedy interleaving that keeps
every prefix within one sample of the weights, at a position in that source's own order that
follows from g alone: a blend resumes by consumed samples like one file.
"""

from __future__ import annotations

import json
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, Optional, Sequence, TypedDict, Union

import numpy as np

from slurmtrain.common.schema import DataConfig

PERIOD = 10_000  # length of a blend's interleaving schedule (mixture error <= 1 / PERIOD)


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
    """A memory-mapped .bin written by `slurmtrain prepare-data` (dtype from its .json sidecar)."""
    meta = json.loads(Path(path).with_suffix(".json").read_text())
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")


def load_tokens(kind: str, path: str | None, max_bytes: int) -> np.ndarray:
    return stdlib_corpus(max_bytes) if kind == "synthetic" else token_file(str(path))


def split_point(n_tokens: int, fraction: float) -> int:
    """Where training tokens end and held-out tokens begin (tokens[:cut] | tokens[cut:])."""
    return n_tokens - int(math.ceil(n_tokens * fraction)) if fraction > 0 else n_tokens


def num_windows(n_tokens: int, seq_len: int) -> int:
    return max(0, (n_tokens - 1) // seq_len)


class Windows:
    """Windows of seq_len + 1 tokens over one or more token arrays; window id -> token rows.

    Source k's windows have ids [offsets[k], offsets[k] + counts[k]); window j of a source starts at
    token j * seq_len (consecutive windows share one token: the last label is the next input)."""

    def __init__(self, arrays: Sequence[np.ndarray], seq_len: int) -> None:
        self.arrays, self.seq_len = list(arrays), seq_len
        self.counts = [num_windows(len(a), seq_len) for a in self.arrays]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def source_of(self, window: int) -> int:
        return int(np.searchsorted(self.offsets, window, side="right") - 1)

    def row(self, window: int) -> np.ndarray:
        k = self.source_of(window)
        start = (window - int(self.offsets[k])) * self.seq_len
        return np.asarray(self.arrays[k][start : start + self.seq_len + 1], dtype=np.int64)


Tokens = Union[np.ndarray, Windows]
Seed = Union[int, Sequence[int]]


class DataPosition(TypedDict):
    """Where the data stands after some samples (checkpoint meta, ledger)."""

    consumed_samples: int
    epoch: NotRequired[int]  # one source
    per_source: NotRequired[dict[str, int]]  # a blend: samples drawn from each source
    epochs: NotRequired[dict[str, int]]


class Sampler:
    """Maps (step, micro step, rank) to sample indices; samples are non-overlapping windows."""

    def __init__(self, n_tokens: int, seq_len: int, seed: Seed) -> None:
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
            seed = list(self.seed) if isinstance(self.seed, (list, tuple)) else [self.seed]
            self._order = np.random.default_rng([*seed, epoch]).permutation(self.num_samples)
        return self._order

    def sample(self, global_index: int) -> int:
        epoch, pos = divmod(global_index, self.num_samples)
        return int(self.order(epoch)[pos])

    def indices(
        self, step: int, micro_step: int, rank: int, micro_batch: int, world: int, global_batch: int
    ) -> list[int]:
        first = self.skip + step * global_batch + (micro_step * world + rank) * micro_batch
        return [self.sample(first + i) for i in range(micro_batch)]

    def position(self, consumed: int) -> DataPosition:
        """Where the data stands after `consumed` samples (checkpoint meta, ledger)."""
        return {"consumed_samples": consumed, "epoch": consumed // self.num_samples}


def schedule(weights: Sequence[float], period: int = PERIOD) -> np.ndarray:
    """The source of each of `period` samples: greedily the source furthest below its share, so
    every prefix of the schedule is within one sample of the weights (deterministic, no RNG)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    counts = np.zeros(len(w))
    out = np.empty(period, dtype=np.int64)
    for i in range(period):
        k = int(np.argmax(w * (i + 1) - counts))
        out[i], counts[k] = k, counts[k] + 1
    return out


class BlendSampler(Sampler):
    """A weighted mixture of sources; the source and its sample follow from the sample index."""

    def __init__(
        self, windows: Windows, weights: Sequence[float], seq_len: int, seed: int, names: list[str]
    ) -> None:
        self.seq_len, self.windows, self.names = seq_len, windows, names
        self.num_samples = len(windows)
        self.skip = 0  # as Sampler: samples skipped past diverged windows
        for name, count in zip(names, windows.counts):
            if count < 1:
                raise ValueError(f"data source {name}: shorter than one sequence ({seq_len})")
        self.sources = [
            Sampler(n * seq_len + 1, seq_len, [seed, k]) for k, n in enumerate(windows.counts)
        ]
        self.schedule = schedule(weights)
        onehot = np.eye(len(names), dtype=np.int64)[self.schedule]  # (PERIOD, K)
        self.prefix = np.cumsum(onehot, axis=0) - onehot  # samples of k before position i
        self.per_period = onehot.sum(axis=0)

    def counts(self, consumed: int) -> list[int]:
        """Samples drawn from each source among the first `consumed` samples."""
        whole, part = divmod(consumed, PERIOD)
        return [
            int(whole * self.per_period[k] + self.prefix[part][k]) for k in range(len(self.names))
        ]

    def sample(self, global_index: int) -> int:
        whole, part = divmod(global_index, PERIOD)
        k = int(self.schedule[part])
        local = whole * int(self.per_period[k]) + int(self.prefix[part][k])
        return int(self.windows.offsets[k]) + self.sources[k].sample(local)

    def position(self, consumed: int) -> DataPosition:
        counts = self.counts(consumed)
        return {
            "consumed_samples": consumed,
            "per_source": dict(zip(self.names, counts)),
            "epochs": {
                n: c // max(self.windows.counts[k], 1)
                for k, (n, c) in enumerate(zip(self.names, counts))
            },
        }


def valid_ids(n_windows: int, wanted: int) -> list[int]:
    """`wanted` window ids evenly spaced over n_windows (all of them when there are fewer)."""
    if n_windows <= wanted:
        return list(range(n_windows))
    return [i * n_windows // wanted for i in range(wanted)]


def share(ids: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's strided share of the validation windows."""
    return list(ids[rank::world])


@dataclass
class Data:
    """What one attempt trains and evaluates on."""

    train: Tokens
    sampler: Sampler
    valid: Optional[Windows] = None
    valid_ids: Optional[list[int]] = None


def _sources(d: DataConfig) -> list[tuple[str, float]]:
    if d.kind == "blend":
        return [(str(s.path), float(s.weight)) for s in d.sources]
    return [(str(d.path), 1.0)]


def load(d: DataConfig) -> Data:
    """The config's `data` section -> training windows, their sampler, the validation windows."""
    fraction = float(d.valid_fraction or 0.0)
    valid_path = d.valid_path
    cut = 0.0 if valid_path else fraction
    if d.kind == "blend":
        names = [p for p, _ in _sources(d)]
        arrays = [token_file(p) for p in names]
        train_parts = [a[: split_point(len(a), cut)] for a in arrays]
        held = [a[split_point(len(a), cut) :] for a in arrays]
        windows = Windows(train_parts, d.seq_len)
        weights = [w for _, w in _sources(d)]
        sampler: Sampler = BlendSampler(windows, weights, d.seq_len, d.seed, names)
        train: Tokens = windows
    else:
        path = d.tokens_path if d.kind == "text" else d.path  # data=text: tokenized at submit
        tokens = load_tokens(d.kind, path, d.max_corpus_bytes)
        train = tokens[: split_point(len(tokens), cut)]
        held = [tokens[split_point(len(tokens), cut) :]]
        sampler = Sampler(len(train), d.seq_len, d.seed)
    if valid_path:
        held = [token_file(str(valid_path))]
    if not valid_path and fraction <= 0:
        return Data(train, sampler)
    valid = Windows(held, d.seq_len)
    if len(valid) < 1:
        raise ValueError(
            f"held-out data ({sum(len(h) for h in held)} tokens) is shorter than one window of "
            f"data.seq_len + 1 = {d.seq_len + 1} tokens; raise data.valid_fraction or set it to 0"
        )
    return Data(train, sampler, valid, valid_ids(len(valid), int(d.valid_windows)))


def batch(tokens: Tokens, sample_ids: list[int], seq_len: int) -> np.ndarray:
    """(micro_batch, seq_len + 1) int64 windows; inputs are [:, :-1], labels [:, 1:]."""
    if isinstance(tokens, Windows):
        return np.stack([tokens.row(i) for i in sample_ids])
    return np.stack(
        [
            np.asarray(tokens[i * seq_len : i * seq_len + seq_len + 1], dtype=np.int64)
            for i in sample_ids
        ]
    )
