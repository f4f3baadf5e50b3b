"""The loop's one per-step all-reduce vector: loss, signal, save due, non-finite."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from slurmtrain.compute.loop import _shared

CPU = torch.device("cpu")


def engine(norm):
    return SimpleNamespace(get_global_grad_norm=lambda: norm)


@pytest.mark.parametrize("norm", [None, 1.0, torch.tensor(2.0)])
def test_finite_step_carries_mean_loss_signal_and_due(norm):
    losses = [torch.tensor(1.0), torch.tensor(3.0)]
    vec = _shared(losses, 2, True, engine(norm), CPU)
    assert vec.dtype == torch.float64 and vec.shape == (6,)
    assert vec.tolist() == [2.0, 2.0, 1.0, 0.0, 0.0, 0.0]
    one = _shared([torch.tensor(1.5)], 0, False, engine(norm), CPU).tolist()
    assert one == [1.5, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    "losses, norm",
    [
        ([torch.tensor(math.nan)], None),
        ([torch.tensor(1.0), torch.tensor(math.inf)], 1.0),
        ([torch.tensor(1.0)], math.inf),
        ([torch.tensor(1.0)], torch.tensor(math.nan)),
        ([torch.tensor(math.nan)], torch.tensor(math.inf)),
        ([torch.tensor(1.0)], torch.tensor(-1.0)),  # DeepSpeed's mark of a non-finite norm
        ([torch.tensor(1.0)], -1.0),
    ],
)
def test_a_non_finite_loss_or_grad_norm_counts_the_rank_once(losses, norm):
    """Summed over ranks, the last field is the number of ranks that saw a non-finite value (the
    Guard's message says "on N rank(s)"): a rank with both a NaN loss and an inf norm counts once."""
    assert _shared(losses, 0, False, engine(norm), CPU).tolist()[3] == 1.0


def test_the_vector_is_built_without_reading_a_value_back_to_the_host(monkeypatch):
    """No .item()/.tolist()/float(tensor) before the all-reduce: on a GPU each would be a host
    sync of its own, and the step may have only the one that reads the all-reduced vector."""
    calls = []
    for name in ("item", "tolist", "__float__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _name=name, _orig=original, **k):
            calls.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    vec = _shared([torch.tensor(1.0)], 1, False, engine(torch.tensor(3.0)), CPU)
    fp16 = _shared([torch.tensor(1.0)], 0, False, fp16_engine(65536.0), CPU, fp16=True)
    assert calls == []
    monkeypatch.undo()
    assert vec.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert fp16.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def fp16_engine(scale: float, applied: bool = False):
    """DeepSpeed's fp16 state after a step: was it applied, and its dynamic loss scaler."""
    scaler = SimpleNamespace(dynamic=True, cur_scale=scale, min_scale=1.0)
    return SimpleNamespace(
        get_global_grad_norm=lambda: math.inf if not applied else 1.0,
        was_step_applied=lambda: applied,
        optimizer=SimpleNamespace(loss_scaler=scaler),
    )


def test_an_fp16_overflow_is_flagged_as_skipped_and_the_minimum_scale_too():
    """The last two fields: the loss scaler skipped the step; its scale is at its minimum."""
    loss = [torch.tensor(2.0)]
    assert _shared(loss, 0, False, fp16_engine(1024.0), CPU, fp16=True).tolist()[3:] == [1, 1, 0]
    assert _shared(loss, 0, False, fp16_engine(1.0), CPU, fp16=True).tolist()[3:] == [1, 1, 1]
    ok = fp16_engine(1024.0, applied=True)
    assert _shared(loss, 0, False, ok, CPU, fp16=True).tolist()[3:] == [0, 0, 0]
