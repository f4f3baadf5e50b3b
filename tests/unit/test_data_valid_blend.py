"""The held-out split, the fixed validation windows and weighted blends (compute/data.py), and
evaluation's signal handling (compute/evaluate.py): pure functions on small token files."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from slurmtrain.compute import data
from slurmtrain.compute.context import RankContext
from slurmtrain.compute.distributed import Placement
from slurmtrain.compute.faults.watchdog import Watchdog


def _ctx(tmp_path: Path, rank: int = 0, world: int = 1) -> RankContext:
    """A rank's context for the Evaluator: its watchdog is never started."""
    where = Placement(rank, 0, world, "127.0.0.1", 29500, None, "n1")
    watchdog = Watchdog(60.0, tmp_path / "stacks.txt", lambda why: None, 1)
    return RankContext(where, "cpu", lambda row: None, watchdog)


def _bin(path: Path, tokens: np.ndarray) -> str:
    tokens.astype(np.int32).tofile(path)
    meta = {"dtype": "int32", "tokens": len(tokens), "vocab_size": 512}
    path.with_suffix(".json").write_text(json.dumps(meta))
    return str(path)


def _cfg(**data_keys) -> object:
    base = {"kind": "tokens", "path": None, "sources": [], "seq_len": 16, "max_corpus_bytes": 0}
    base |= {"seed": 7, "valid_fraction": 0.05, "valid_path": None, "valid_windows": 24}
    return OmegaConf.create(base | data_keys)


def _train_tokens(d: data.Data, n: int = 5000) -> set[int]:
    """Every token value the first n training samples touch (tokens are unique: arange)."""
    seen: set[int] = set()
    for g in range(n):
        seen.update(data.batch(d.train, [d.sampler.sample(g)], d.sampler.seq_len)[0].tolist())
    return seen


def _valid_tokens(d: data.Data) -> set[int]:
    return set(data.batch(d.valid, d.valid_ids, d.sampler.seq_len).ravel().tolist())


def test_validation_windows_never_overlap_training_samples(tmp_path):
    d = data.load(_cfg(path=_bin(tmp_path / "a.bin", np.arange(20_000))))
    assert len(d.valid_ids) == 24 and len(set(d.valid_ids)) == 24
    assert not _train_tokens(d) & _valid_tokens(d)
    # every training window lies in the first 95%
    assert max(_train_tokens(d)) < 19_000 <= min(_valid_tokens(d))


def test_blend_held_out_regions_never_overlap_training(tmp_path):
    a = _bin(tmp_path / "a.bin", np.arange(0, 10_000))
    b = _bin(tmp_path / "b.bin", np.arange(10_000, 16_000))
    sources = [{"path": a, "weight": 0.7}, {"path": b, "weight": 0.3}]
    d = data.load(_cfg(kind="blend", sources=sources))
    assert not _train_tokens(d) & _valid_tokens(d)
    assert {t // 10_000 for t in _valid_tokens(d)} == {0, 1}  # both sources held out


def test_valid_path_is_the_held_out_set_and_the_corpus_trains_whole(tmp_path):
    train = _bin(tmp_path / "t.bin", np.arange(8_000))
    valid = _bin(tmp_path / "v.bin", np.arange(100_000, 101_000))
    d = data.load(_cfg(path=train, valid_path=valid))
    assert d.sampler.num_samples == (8_000 - 1) // 16
    assert min(_valid_tokens(d)) >= 100_000


def _shares(ids: list[int], world: int) -> list[list[int]]:
    from slurmtrain.compute.evaluate import Evaluator

    cfg = OmegaConf.create(
        {
            "train": {"eval_interval": 5, "max_steps": 20, "micro_batch_size": 4},
            "data": {"seq_len": 16},
        }
    )
    out = []
    for rank in range(world):
        ev = Evaluator(data.Data(None, None, None, ids), cfg, _ctx(Path("."), rank, world))
        out.append([i for batch, w in ev.plan() for i, wi in zip(batch, w) if wi > 0])
        shapes = [len(b) for b, _ in ev.plan()]
        out[-1].append(tuple(shapes))  # every rank: the same batches (ZeRO-3 forwards)
    return out


def test_validation_windows_are_the_same_for_world_sizes_1_and_2_and_restarts(tmp_path):
    path = _bin(tmp_path / "a.bin", np.arange(20_000))
    ids = data.load(_cfg(path=path)).valid_ids
    assert ids == data.load(_cfg(path=path)).valid_ids  # a restart builds the same list
    one, two = _shares(ids, 1), _shares(ids, 2)
    assert sorted(one[0][:-1]) == sorted(two[0][:-1] + two[1][:-1]) == sorted(ids)
    assert not set(two[0][:-1]) & set(two[1][:-1])
    assert two[0][-1] == two[1][-1]
    odd = ids[:23]  # not divisible by the world size: padded, every window counted once
    s = _shares(odd, 2)
    assert sorted(s[0][:-1] + s[1][:-1]) == sorted(odd) and s[0][-1] == s[1][-1]


def test_blend_mixture_within_one_percent_deterministic_and_resumable(tmp_path):
    a = _bin(tmp_path / "a.bin", np.arange(0, 30_000))
    b = _bin(tmp_path / "b.bin", np.arange(30_000, 33_000))  # small: repeats (epochs)
    cfg = _cfg(kind="blend", sources=[{"path": a, "weight": 0.7}, {"path": b, "weight": 0.3}])
    d = data.load(cfg)
    n = 10_000
    drawn = [d.sampler.sample(g) for g in range(n)]
    realized = Counter(d.train.source_of(w) for w in drawn)
    assert abs(realized[0] / n - 0.7) < 0.01 and abs(realized[1] / n - 0.3) < 0.01
    for start in (0, 1, 9_999, 10_000, 25_003):  # a restart from consumed samples alone
        fresh = data.load(cfg).sampler
        assert [fresh.sample(g) for g in range(start, start + 50)] == [
            d.sampler.sample(g) for g in range(start, start + 50)
        ]
    for consumed in (0, 7, 9_999, 10_000, 12_345):
        counts = Counter(d.train.source_of(d.sampler.sample(g)) for g in range(consumed))
        assert d.sampler.counts(consumed) == [counts[0], counts[1]]
    pos = d.sampler.position(n)
    assert pos["per_source"] == {a: realized[0], b: realized[1]} and pos["consumed_samples"] == n
    # within a source, each epoch is a permutation of its training windows
    b_windows = [w for w in drawn if d.train.source_of(w) == 1][: d.train.counts[1]]
    assert sorted(b_windows) == list(range(d.train.offsets[1], d.train.offsets[2]))


def test_blend_schedule_every_prefix_within_one_sample_of_the_weights():
    sched = data.schedule([0.5, 0.3, 0.2], period=2000)
    counts = np.cumsum(np.eye(3)[sched], axis=0)
    ideal = np.arange(1, 2001)[:, None] * np.array([0.5, 0.3, 0.2])
    assert np.abs(counts - ideal).max() <= 1.0


def test_a_stop_signal_during_evaluation_is_honoured_at_the_next_batch(tmp_path):
    import torch
    import torch.distributed as dist

    from slurmtrain.compute.evaluate import Evaluator
    from slurmtrain.compute.faults.signals import NONE, TIME_LIMIT, SignalFlags

    class Uniform(torch.nn.Module):
        def forward(self, input_ids):
            calls.append(1)
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 512)})()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29_000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        d = data.load(_cfg(path=_bin(tmp_path / "a.bin", np.arange(20_000) % 512)))
        cfg = OmegaConf.create(
            {
                "train": {"eval_interval": 5, "max_steps": 20, "micro_batch_size": 4},
                "data": {"seq_len": 16},
            }
        )
        flags, calls = SignalFlags(), []
        values, code = Evaluator(d, cfg, _ctx(tmp_path)).run(Uniform(), flags)
        assert code == NONE and len(calls) == 6  # 24 windows / micro batch 4
        assert values["valid_loss"] == pytest.approx(np.log(512), rel=1e-6)
        assert values["valid_ppl"] == pytest.approx(512, rel=1e-5)

        calls.clear()

        def usr2_arrives():
            if len(calls) == 2:
                flags.code = TIME_LIMIT

        ev = Evaluator(d, cfg, _ctx(tmp_path), on_batch=usr2_arrives)
        assert ev.run(Uniform(), flags) == ({}, TIME_LIMIT)
        assert len(calls) == 2  # stopped at the batch the signal arrived in, not after all 6
    finally:
        dist.destroy_process_group()
