"""Held-out evaluation: the validation loss on a fixed set of windows, every rank a strided share.

Every `train.eval_interval` steps and at the last step the ranks evaluate `data.valid_ids` (the same
windows whatever the world size or restart): rank r takes ids[r::world], padded to the same length
on every rank (a padding window counts 0), because ZeRO-3 gathers parameters collectively in each
forward. One all-reduce per batch carries the loss sum, the token count and the signal flags: a
stop signal is honoured at the next batch, all ranks together, and the evaluation is dropped.
Evaluation is its own watchdog phase (`eval`), every batch a heartbeat: a long pass is no hang.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import torch
import torch.distributed as dist

from slurmtrain.common.schema import RootConfig
from slurmtrain.compute import parallel
from slurmtrain.compute.context import RankContext
from slurmtrain.compute.data import Data, share
from slurmtrain.compute.faults.signals import NONE, TERMINATE, TIME_LIMIT, SignalFlags
from slurmtrain.compute.observe.perf import Perf
from slurmtrain.planning import deadlines

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from slurmtrain.compute.parallel import SequenceShard


class Evaluator:
    """`data`'s held-out windows, evaluated in the watchdog's `eval` phase (deadline `deadline_s`);
    `on_batch`: called after each batch's forward (tests)."""

    def __init__(
        self,
        data: Data,
        cfg: RootConfig,
        ctx: RankContext,
        deadline_s: float = 0.0,
        on_batch: Optional[Callable[[], None]] = None,
        shard: Optional[tuple[int, int]] = None,
    ) -> None:
        self.data, self.rank, self.world, self.device = data, ctx.rank, ctx.world, ctx.device
        if shard is not None:  # tensor parallelism: (data-parallel rank, size); a TP group
            self.rank, self.world = shard  # evaluates the same windows (the sums count each TP
            # rank once, numerator and denominator alike: the mean is unchanged)
        # Sequence parallelism: each rank scores its slice of the same windows; the slices are
        # equal, so the sums (each SP rank counted once, as TP's) give the whole windows' mean.
        self.sequence = parallel.sequence_shard(cfg)
        self.watchdog, self.deadline_s = ctx.watchdog, deadline_s
        self.interval = int(cfg.train.eval_interval or 0)
        self.max_steps = int(cfg.train.max_steps or 0)
        self.micro = int(cfg.train.micro_batch_size)
        self.seq = int(cfg.data.seq_len)
        self.on_batch = on_batch

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and bool(self.data.valid_ids)

    def due(self, step: int) -> bool:
        return self.enabled and (step % self.interval == 0 or step == self.max_steps)

    def plan(self) -> list[tuple[list[int], list[float]]]:
        """This rank's batches: (window ids, weights); padded so every rank has the same shape."""
        ids = self.data.valid_ids or []
        mine = share(ids, self.rank, self.world)
        length = math.ceil(len(ids) / self.world)
        weights = [1.0] * len(mine) + [0.0] * (length - len(mine))
        mine = mine + [ids[0]] * (length - len(mine))
        return [
            (mine[i : i + self.micro], weights[i : i + self.micro])
            for i in range(0, length, self.micro)
        ]

    def run(self, engine: DeepSpeedEngine, flags: SignalFlags) -> tuple[dict[str, float], int]:
        """({valid_loss, valid_ppl} or {} when a signal cut it short, the agreed stop code)."""
        from slurmtrain.compute.data import batch

        total = torch.zeros(2, dtype=torch.float64)
        was_training = engine.training
        engine.eval()
        batches = self.plan()
        try:
            with torch.no_grad(), self.watchdog.during(deadlines.EVAL, self.deadline_s, "eval"):
                for n, (ids, weights) in enumerate(batches, 1):
                    assert self.data.valid is not None  # valid_ids index the held-out windows
                    window = torch.from_numpy(batch(self.data.valid, ids, self.seq)).to(self.device)
                    per_window = window_losses(engine, window, self.sequence)
                    w = torch.tensor(weights, dtype=torch.float64, device=per_window.device)
                    self.watchdog.beat(f"eval batch {n}/{len(batches)}")
                    if self.on_batch is not None:
                        self.on_batch()
                    shared = torch.tensor(
                        [
                            float((per_window.double() * w).sum().item()),
                            float(w.sum().item()),
                            float(flags.code == TIME_LIMIT),
                            float(flags.code == TERMINATE),
                        ],
                        dtype=torch.float64,
                        device=self.device,
                    )
                    dist.all_reduce(shared)
                    loss_sum, count, usr2, term = shared.tolist()
                    if term > 0 or usr2 > 0:
                        return {}, TERMINATE if term > 0 else TIME_LIMIT
                    total += torch.tensor([loss_sum, count], dtype=torch.float64)
        finally:
            if was_training:
                engine.train()
        loss = float(total[0] / max(float(total[1]), 1.0))
        return {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 80.0))}, NONE


class _Output(Protocol):
    logits: torch.Tensor


class _LanguageModel(Protocol):
    def __call__(self, *, input_ids: torch.Tensor) -> _Output: ...


def window_losses(
    model: _LanguageModel, window: torch.Tensor, sequence: Optional[SequenceShard] = None
) -> torch.Tensor:
    """Mean next-token cross entropy of each window (inputs window[:, :-1], labels window[:, 1:]);
    with `sequence`, of this rank's slice of each window."""
    if sequence is not None:
        assert isinstance(model, torch.nn.Module)
        return parallel.slice_losses(model, window, sequence).mean(dim=1)
    logits = model(input_ids=window[:, :-1]).logits.float()
    flat = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1), reduction="none"
    )
    return flat.view(window.size(0), -1).mean(dim=1)


def maybe(
    evaluator: Optional[Evaluator],
    engine: DeepSpeedEngine,
    step: int,
    flags: SignalFlags,
    perf: Perf,
    stopping: int = NONE,
) -> tuple[dict[str, float], int]:
    """The loop's one call: evaluate when due (not when the ranks already agreed to stop); its
    time is kept out of step time and tokens/s (Perf.saving: not training time)."""
    if stopping or evaluator is None or not evaluator.due(step):
        return {}, NONE
    with perf.saving():
        return evaluator.run(engine, flags)
