"""The learning-rate schedule is metaseq's, from 0 to the peak, then linear decay
to min_lr at the last step. A pure function of the update count, and the torch scheduler that
DeepSpeed steps gives exactly its values."""

from __future__ import annotations

import pytest
import torch

from slurmtrain.common import ds_config
from tests.unit.test_recipes_placement import _cfg


def test_warm_up_starts_at_zero_and_the_first_update_is_not_a_no_op():
    lrs = [ds_config.lr_at(k, 1.0, 0.1, warmup=4, total=10) for k in range(10)]
    # Update k+1 trains at peak x (k+1) / warmup: never 0 (DeepSpeed's WarmupDecayLR started at
    # warmup_min_lr, 10% of the peak here, and ran its first two updates there).
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # Then linear to 10% of the peak at the last update, as metaseq's polynomial_decay (power 1).
    assert lrs[3:] == pytest.approx([1.0, 0.85, 0.7, 0.55, 0.4, 0.25, 0.1])
    assert ds_config.lr_at(10, 1.0, 0.1, 4, 10) == pytest.approx(0.1)  # past the end: the floor


def test_no_warm_up_and_a_warm_up_longer_than_the_run():
    assert ds_config.lr_at(0, 1.0, 0.1, warmup=0, total=10) == pytest.approx(1 - 0.9 / 10)
    # A run shortened below its recipe's warm-up (train.max_steps=20): still the warm-up's ramp.
    short = [ds_config.lr_at(k, 1.0, 0.1, warmup=89, total=20) for k in range(20)]
    assert short == pytest.approx([(k + 1) / 89 for k in range(20)])


def test_the_scheduler_deepspeed_steps_gives_the_pure_values_and_resumes():
    cfg = _cfg("train.max_steps=10", "optim.warmup_steps=4", "optim.lr=1.0")
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.optim.lr)
    sched = ds_config.lr_scheduler(cfg)(opt)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [ds_config.lr_at(k, 1.0, cfg.optim.min_lr, 4, 10) for k in range(10)]
    assert seen == pytest.approx(expected) and seen[0] > 0
    # A checkpoint of the old WarmupDecayLR ({'last_batch_iteration': k - 1} after k updates)
    # resumes on this schedule at the same update.
    old = ds_config.lr_scheduler(cfg)(torch.optim.AdamW(net.parameters(), lr=1.0))
    old.load_state_dict({"last_batch_iteration": 5})
    assert old.get_last_lr()[0] == pytest.approx(expected[6])
    again = ds_config.lr_scheduler(cfg)(torch.optim.AdamW(net.parameters(), lr=1.0))
    again.load_state_dict(sched.state_dict())
    assert again.last_epoch == 10


def test_the_opt_recipes_schedule():
    cfg = _cfg("model=opt13b")
    w, t, peak = cfg.optim.warmup_steps, cfg.train.max_steps, cfg.optim.lr
    assert (w, t, peak) == (89, 71525, 1e-4)
    assert ds_config.lr_at(0, peak, cfg.optim.min_lr, w, t) == pytest.approx(peak / 89)
    assert ds_config.lr_at(t - 1, peak, cfg.optim.min_lr, w, t) == pytest.approx(0.1 * peak)
    assert "scheduler" not in ds_config.build(cfg, 512)  # DeepSpeed's own cannot express it
