"""Divergence: judging each step's loss and gradient norm, and planning the rollback that follows.

Every rank sees the same all-reduced loss and count of ranks with a non-finite loss or gradient
norm, so every rank reaches the same verdict at the same step. A verdict means: the step is not
kept (the rollback reloads the newest valid checkpoint: weights, optimizer, scheduler, RNG), the
data window that diverged is skipped (PaLM's practice), and the run goes on in the same process.
A divergence that comes back within faults.rollback_repeat_window steps of the previous one means
the checkpoint rolled back to already carried the instability: the next rollback returns to an
older checkpoint than that one (`deeper_than`), and so on back until none is left.
Pure arithmetic here (no torch): the Trainer does the collective reload.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from slurmtrain.common.events import Rollback
from slurmtrain.common.schema import FaultsConfig

MIN_HISTORY = 10  # losses the spike test needs before it judges

Rollbacks = Sequence[Rollback]  # the ledger's rollback rows, oldest first


@dataclass
class Divergence:
    step: int  # the optimizer step whose loss (or gradient norm, or saved state) was bad
    loss: float
    why: str


class Guard:
    """Non-finite loss or gradient norm on any rank, or a loss spike over the running median.

    An fp16 step the loss scaler skipped (its gradients overflowed: DeepSpeed halves the scale and
    leaves the weights untouched) is no divergence: it changed nothing. Only a sustained run of
    them is: more than `max_overflow_steps` in a row, or one at the scaler's minimum scale (where
    DeepSpeed's next overflow aborts the run: "Current loss scale already at minimum")."""

    def __init__(
        self, spike_factor: float = 0.0, window: int = 50, max_overflow_steps: int = 50
    ) -> None:
        self.factor = float(spike_factor)
        self.recent: deque[float] = deque(maxlen=max(int(window), MIN_HISTORY))
        self.max_overflows = int(max_overflow_steps)
        self.overflows = 0  # skipped steps in a row

    def judge(
        self,
        step: int,
        loss: float,
        bad_ranks: float,
        skipped: float = 0.0,
        scale_at_minimum: float = 0.0,
    ) -> Optional[Divergence]:
        """`skipped` > 0: the loss scaler skipped this step (any rank: they agree);
        `scale_at_minimum` > 0: its scale is at fp16.min_loss_scale."""
        if skipped > 0:
            self.overflows += 1
            n = self.overflows
            if scale_at_minimum > 0:
                return self._end(
                    Divergence(
                        step,
                        loss,
                        f"fp16 loss scale at its minimum and still overflowing ({n} skipped "
                        f"step(s) in a row)",
                    )
                )
            if n > self.max_overflows >= 0:
                return self._end(
                    Divergence(
                        step,
                        loss,
                        f"{n} fp16 overflow steps in a row "
                        f"(faults.max_overflow_steps={self.max_overflows})",
                    )
                )
            return None  # nothing was applied: the loss is no sample for the spike median
        self.overflows = 0
        if bad_ranks > 0 or not math.isfinite(loss):
            ranks = f" on {int(bad_ranks)} rank(s)" if bad_ranks > 0 else ""
            return Divergence(step, loss, f"non-finite loss or gradient norm{ranks}")
        if self.factor > 0 and len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if median > 0 and loss > self.factor * median:
                return Divergence(
                    step,
                    loss,
                    f"loss spike: {loss:.4g} > faults.spike_factor={self.factor:g} x running "
                    f"median {median:.4g}",
                )
        self.recent.append(loss)
        return None

    def _end(self, d: Divergence) -> Divergence:
        self.overflows = 0  # the Trainer rolls back: the count starts again from there
        return d


def finite_or_text(value: Optional[float]) -> Union[float, str, None]:
    """A value for the JSON ledger: NaN/inf as text (json would write invalid JSON)."""
    if value is None:
        return None
    return value if math.isfinite(value) else str(value)


@dataclass
class Plan:
    stop: Optional[str] = None  # why the run stops `diverged` instead of rolling back
    to_step: int = 0
    skip_steps: int = 0  # optimizer steps' worth of samples skipped
    skip_samples: int = 0  # the sampler's offset after the rollback (cumulative)
    number: int = 0  # this rollback's number over the whole run


def deeper_than(d: Divergence, previous: Rollbacks, faults_cfg: FaultsConfig) -> Optional[int]:
    """The step a repeated divergence must roll back before (the previous rollback's target), or
    None when this one is new (no rollback before, or more than the window ago)."""
    window = int(getattr(faults_cfg, "rollback_repeat_window", 0))
    last = previous[-1] if previous else None
    if last is None or window <= 0 or last.to_step is None:
        return None
    if d.step - (d.step if last.step is None else last.step) > window:
        return None
    return last.to_step


def plan_rollback(
    d: Divergence,
    checkpoint_step: Optional[int],
    checkpoint_skip: int,
    previous: Rollbacks,
    faults_cfg: FaultsConfig,
    max_steps: int,
    global_batch: int,
) -> Plan:
    """Where to roll back to and how much data to skip, or why the run must stop instead.

    `checkpoint_skip`: the samples the checkpoint's own run had skipped (its data_position).
    Skipped: at least the window that diverged (checkpoint step .. diverged step), and
    faults.skip_batches steps' worth, bounded by a tenth of the run (tiny runs).
    """
    what = f"loss {d.loss:.4g} at step {d.step} ({d.why})"
    limit = int(faults_cfg.max_rollback)
    if 0 <= limit <= len(previous):  # -1: unlimited
        return Plan(stop=f"{what}; {len(previous)} rollbacks already (faults.max_rollback={limit})")
    before = deeper_than(d, previous, faults_cfg)
    if before is not None and (checkpoint_step is None or checkpoint_step >= before):
        last = previous[-1]
        return Plan(
            stop=f"{what}; diverged again within faults.rollback_repeat_window="
            f"{faults_cfg.rollback_repeat_window} steps of the rollback at step {last.step} "
            f"(to step {before}), and no valid checkpoint older than step {before} is left"
        )
    if checkpoint_step is None:
        return Plan(stop=f"{what}; no valid checkpoint to roll back to")
    if previous and previous[-1].to_step == checkpoint_step:
        last = previous[-1]
        return Plan(
            stop=f"{what}; diverged again after rolling back to step {checkpoint_step} and "
            f"skipping {last.skipped_samples} samples (rollback at step {last.step})"
        )
    window = max(d.step - checkpoint_step, 1)
    skip_steps = max(window, min(int(faults_cfg.skip_batches), max(max_steps // 10, 1)))
    return Plan(
        to_step=checkpoint_step,
        skip_steps=skip_steps,
        skip_samples=checkpoint_skip + skip_steps * global_batch,
        number=len(previous) + 1,
    )


def resumed_skip(manifest_skip: int, step: int, previous: Rollbacks) -> int:
    """The sampler offset for a run resumed at `step`: the checkpoint's own, unless a rollback
    returned to this very checkpoint (and skipped data) before the attempt ended: then that one."""
    for e in reversed(previous):
        if e.to_step == step and e.data_skip is not None:
            return max(e.data_skip, manifest_skip)
    return manifest_skip
