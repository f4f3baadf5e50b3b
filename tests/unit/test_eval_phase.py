"""Evaluation is its own watchdog phase with a heartbeat per batch (compute/evaluate.py): a validation
pass longer than the step deadline is progress, not a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from slurmtrain.compute import data
from slurmtrain.compute.context import RankContext
from slurmtrain.compute.distributed import Placement


def _tokens(path: Path) -> str:
    (np.arange(20_000) % 512).astype(np.int32).tofile(path)
    meta = {"dtype": "int32", "tokens": 20_000, "vocab_size": 512}
    path.with_suffix(".json").write_text(json.dumps(meta))
    return str(path)


def test_a_validation_pass_longer_than_the_step_deadline_beats_and_is_not_a_hang(tmp_path):
    import torch
    import torch.distributed as dist

    from slurmtrain.compute.evaluate import Evaluator
    from slurmtrain.compute.faults.signals import NONE, SignalFlags
    from slurmtrain.compute.faults.watchdog import Watchdog

    now = [0.0]
    seen = []  # (phase, overdue) after each batch
    fired = []
    watchdog = Watchdog(10.0, tmp_path / "hang.txt", fired.append, 99, clock=lambda: now[0])
    watchdog.phase("step", 10.0, "step 5")

    class SlowUniform(torch.nn.Module):
        def forward(self, input_ids):
            now[0] += 4.0  # each batch's forward: 4 s of a 10 s step deadline
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 512)})()

    def after_batch():
        seen.append((watchdog.current, watchdog.overdue()))

    base = {"kind": "tokens", "path": _tokens(tmp_path / "t.bin"), "sources": [], "seq_len": 16}
    base |= {"max_corpus_bytes": 0, "seed": 7, "valid_fraction": 0.05, "valid_path": None}
    d = data.load(OmegaConf.create(base | {"valid_windows": 24}))
    cfg = OmegaConf.create(
        {
            "train": {"eval_interval": 5, "max_steps": 20, "micro_batch_size": 4},
            "data": {"seq_len": 16},
        }
    )
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(30_000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        where = Placement(0, 0, 1, "127.0.0.1", 29500, None, "n1")
        ctx = RankContext(where, torch.device("cpu"), lambda row: None, watchdog)
        ev = Evaluator(d, cfg, ctx, deadline_s=10.0, on_batch=after_batch)
        values, code = ev.run(SlowUniform(), SignalFlags())
    finally:
        dist.destroy_process_group()
    assert code == NONE and "valid_loss" in values
    assert len(seen) == 6  # 24 windows / micro batch 4: 24 s of evaluation, deadline 10 s
    assert all(phase == "eval" and why is None for phase, why in seen), seen
    assert watchdog.current == "step" and watchdog.overdue() is None  # the step phase resumes
    assert fired == []
