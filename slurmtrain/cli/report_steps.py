"""The report's step-axis panels: loss (train, valid_loss, the steps recomputed later) and the
learning rate against the training step, with the saved checkpoints (thinned to stay readable)
and the steps the run resumed from. Login node: no torch; matplotlib is imported by the caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence, TypeGuard

from slurmtrain.common import events
from slurmtrain.common.events import Row

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D

Metrics = Sequence[Mapping[str, object]]  # metrics.jsonl rows (not ledger rows)

MOST_CHECKPOINTS = 20  # markers drawn at most (the first, the last and resumed-from ones besides)
CKPT_COLOR, RESUME_COLOR, LOST_COLOR = "#1f77b4", "#2ca02c", "#d62728"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Thinned:
    """The checkpoint rows drawn: every `every`-th of `total`, the first, the last and those the
    run resumed from."""

    rows: tuple[events.CheckpointSaved, ...]
    total: int
    every: int

    @property
    def label(self) -> str:
        if self.every <= 1:
            return "checkpoint saved"
        return f"checkpoints (every {ordinal(self.every)} of {self.total})"


def resumed_steps(ledger: Sequence[Row]) -> set[int]:
    """The steps a later attempt loaded (a branch's parent step too, if loaded)."""
    return {e.step for e in ledger if isinstance(e, events.CheckpointLoaded) and e.step is not None}


def thin_checkpoints(ledger: Sequence[Row], most: int = MOST_CHECKPOINTS) -> Thinned:
    saved = [e for e in ledger if isinstance(e, events.CheckpointSaved)]
    every = max(1, math.ceil(len(saved) / most))
    resumed = resumed_steps(ledger)
    last = len(saved) - 1
    rows = tuple(e for i, e in enumerate(saved) if i % every == 0 or i == last or e.step in resumed)
    return Thinned(rows, len(saved), every)


def _number(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def by_attempt(metrics: Metrics, key: str) -> dict[int, tuple[list[float], list[float]]]:
    """Per attempt (lines never join across a restart): the steps and values of `key`."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for m in metrics:
        v, step = m.get(key), m.get("step")
        if _number(v) and _number(step):
            xs, ys = out.setdefault(_attempt(m), ([], []))
            xs.append(float(step))
            ys.append(float(v))
    return out


def _na(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#777777")


def step_panels(
    ax_loss: Axes,
    ax_lr: Axes,
    metrics: Metrics,
    ledger: Sequence[Row],
    lost: frozenset[tuple[int, int]] = frozenset(),
) -> list[Line2D]:
    """Loss and learning rate against the step, checkpoint and resume markers on both; returns
    the legend handles."""
    from matplotlib.lines import Line2D

    handles: list[Line2D] = []
    for i, (_a, (xs, ys)) in enumerate(sorted(by_attempt(metrics, "loss").items())):
        (line,) = ax_loss.plot(xs, ys, lw=1.2, color=CKPT_COLOR, label="train loss")
        handles += [] if i else [line]
    for i, (_a, (xs, ys)) in enumerate(sorted(by_attempt(metrics, "valid_loss").items())):
        (line,) = ax_loss.plot(xs, ys, lw=1.2, color="#ff7f0e", marker="o", ms=3, label="valid")
        handles += [] if i else [line]
    pts = [
        (float(step), float(v))
        for m in metrics
        if _number(step := m.get("step"))
        and (_attempt(m), step) in lost
        and _number(v := m.get("loss"))
    ]
    if pts:
        xs_lost, ys_lost = [x for x, _ in pts], [y for _, y in pts]
        ax_loss.scatter(xs_lost, ys_lost, s=14, color=LOST_COLOR, zorder=3)
        handles.append(Line2D([], [], color=LOST_COLOR, marker="o", ls="", label="lost later"))
    if not handles:
        _na(ax_loss, "loss: n/a (not in metrics.jsonl)")
    lr = by_attempt(metrics, "lr")
    for _a, (xs, ys) in sorted(lr.items()):
        ax_lr.plot(xs, ys, lw=1.2, color="#8c564b")
    if not lr:
        _na(ax_lr, "learning rate: n/a (no lr in metrics.jsonl)")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_loss.set_ylabel("loss")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    return handles + _step_markers((ax_loss, ax_lr), ledger)


def _attempt(m: Mapping[str, object]) -> int:
    attempt = m.get("attempt")
    return int(attempt) if isinstance(attempt, (int, float)) and attempt else 1


class _Style(NamedTuple):
    color: str
    ls: str
    lw: float
    alpha: float


CKPT = _Style(CKPT_COLOR, "-", 0.6, 0.35)
RESUME = _Style(RESUME_COLOR, "--", 1.2, 0.9)


def _step_markers(axes: Sequence[Axes], ledger: Sequence[Row]) -> list[Line2D]:
    from matplotlib.lines import Line2D

    thinned = thin_checkpoints(ledger)
    steps = sorted({e.step for e in thinned.rows if e.step is not None})
    resumed = sorted(resumed_steps(ledger))
    marks = [(s, CKPT) for s in steps] + [(s, RESUME) for s in resumed]
    for ax in axes:
        for x, st in marks:
            ax.axvline(x, color=st.color, ls=st.ls, lw=st.lw, alpha=st.alpha)
    named = [(thinned.label, CKPT)] if steps else []
    named += [("resumed from", RESUME)] if resumed else []
    return [
        Line2D([], [], color=st.color, ls=st.ls, lw=st.lw, alpha=st.alpha, label=name)
        for name, st in named
    ]
