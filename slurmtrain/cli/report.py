"""`slurmtrain report RUN [--out PNG] [--live]`: a run over its steps and its wall time in one PNG.

Against the step (report_steps.py): loss (train, the held-out valid_loss as its own line, the
steps recomputed later) and the learning rate, with the checkpoints and the steps resumed from.
Against wall time: loss, tokens/s, MFU (or TFLOP/s per GPU), goodput breakdown (cumulative share
and a timeline strip), with markers for attempts, requeues, failures (by class, coloured from
common/events.py's table) and saved checkpoints (at most ~20 drawn: every k-th, the first, the
last and those resumed from). A user's pause (goodput's "paused by you") is a grey hatched span,
left out of the shares. A short text summary goes to stdout. Login node: matplotlib with the Agg
backend, no torch.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NotRequired, Optional, Sequence, TypedDict

from slurmtrain.cli import run_arg
from slurmtrain.cli.goodput import LABELS, PARTS, Analysis, analyze, format_table, ledger_rows
from slurmtrain.cli.report_steps import Thinned, step_panels, thin_checkpoints
from slurmtrain.cli.report_stragglers import node_panel
from slurmtrain.cli.startup_phases import format_startup
from slurmtrain.common import events, read_skips
from slurmtrain.common.events import TRAITS, Row, Rows
from slurmtrain.common.jsonl import read_jsonl
from slurmtrain.common.rundir import RunDir
from slurmtrain.planning.eta import format_duration

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

Metrics = Sequence[Mapping[str, object]]  # metrics.jsonl rows (not ledger rows)

PART_COLORS = {
    "productive": "#2ca02c",
    "checkpoint_save": "#1f77b4",
    "checkpoint_load": "#17becf",
    "startup": "#9467bd",
    "queue_wait": "#c7c7c7",
    "work_lost": "#d62728",
    "signal_idle": "#ff7f0e",
    "other": "#e7cba9",
    "user_paused": "#dddddd",  # hatched: left out of goodput
}
# Bottom band = running goodput; queue wait (the job not running at all) on top.
STACK = (
    "productive",
    "checkpoint_save",
    "checkpoint_load",
    "startup",
    "work_lost",
    "signal_idle",
    "other",
    "queue_wait",
    "user_paused",
)
CLASS_COLORS: dict[str, str] = {cls.value: traits.colour for cls, traits in TRAITS.items()}
UNKNOWN_CLASS_COLOR = "#7f7f7f"  # a class this version does not know (a newer writer's)


class Style(TypedDict):
    color: str
    ls: str
    lw: float
    alpha: NotRequired[float]


# The ledger rows marked on every panel (failures too, coloured by class) and their legend names.
MARKERS: dict[type[Row], tuple[Style, str]] = {
    events.Started: (Style(color="#2ca02c", ls="--", lw=1.0, alpha=0.8), "attempt started"),
    events.Requeued: (Style(color="#ff7f0e", ls=":", lw=1.4, alpha=0.9), "job requeued"),
}
CKPT_STYLE = Style(color="#1f77b4", ls="-", lw=0.6, alpha=0.35)  # the thinned checkpoints
PAUSE_HATCH = "//"


def _unit(wall: float) -> tuple[float, str]:
    if wall <= 2 * 3600:
        return 60.0, "minutes"
    if wall <= 3 * 86400:
        return 3600.0, "hours"
    return 86400.0, "days"


def summary(run_dir: Path, a: Analysis, ledger: Rows, metrics: Metrics) -> str:
    """Steps, attempts, failures by class and the goodput table, as plain text."""
    kinds = Counter(type(e) for e in ledger)
    failures = Counter(e.cls or "?" for e in ledger if isinstance(e, events.Failed))
    steps = [step for m in metrics if isinstance(step := m.get("step"), int)]
    g = a.goodput
    fail = ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) or "none"
    valid = [m for m in metrics if isinstance(m.get("valid_loss"), (int, float))]
    from slurmtrain.login.branch import lineage_line

    lineage = lineage_line(ledger)  # a branch (resume_from): its parent, step and changed keys
    return "\n".join(
        [
            f"run       {run_dir}",
            *([f"lineage   {lineage}"] if lineage else []),
            f"steps     last {max(steps, default=0)}, logged {len(steps)}, kept {g.steps_kept}, lost {g.steps_lost}",
            *(
                [f"valid     loss {valid[-1]['valid_loss']:.4f} at step {valid[-1].get('step')}"]
                if valid
                else []
            ),
            f"attempts  {g.attempts}   requeues {kinds[events.Requeued]}   "
            f"signals {kinds[events.Signal]}   checkpoints saved {kinds[events.CheckpointSaved]}",
            f"failures  {fail}",
            "",
            format_table(g),
            *(["", startup] if (startup := format_startup(ledger)) else []),
        ]
    )


def _series(
    metrics: Metrics, key: str, t0: float, unit: float
) -> dict[int, tuple[list[float], list[float]]]:
    """Per attempt (so lines never join across a restart): x in `unit` since t0, y."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for m in metrics:
        v, t = m.get(key), m.get("time")
        if isinstance(v, (int, float)) and isinstance(t, (int, float)):
            xs, ys = out.setdefault(_attempt_of(m), ([], []))
            xs.append((t - t0) / unit)
            ys.append(float(v))
    return out


def _attempt_of(m: Mapping[str, object]) -> int:
    attempt = m.get("attempt")
    return int(attempt) if isinstance(attempt, (int, float)) and attempt else 1


def _metric_panel(
    ax: Axes,
    metrics: Metrics,
    key: str,
    label: str,
    t0: float,
    unit: float,
    scale: float = 1.0,
    lost: frozenset[tuple[int, int]] = frozenset(),
) -> bool:
    series = _series(metrics, key, t0, unit)
    for _attempt, (xs, ys) in sorted(series.items()):
        ax.plot(xs, [y * scale for y in ys], lw=1.2, color="#1f77b4")
    if lost:
        pts = [
            ((t - t0) / unit, v * scale)
            for m in metrics
            if (_attempt_of(m), m.get("step")) in lost
            and isinstance(v := m.get(key), (int, float))
            and isinstance(t := m.get("time"), (int, float))
        ]
        if pts:
            xs_lost, ys_lost = [x for x, _ in pts], [y for _, y in pts]
            ax.scatter(
                xs_lost, ys_lost, s=14, color="#d62728", zorder=3, label="recomputed later (lost)"
            )
            ax.legend(loc="upper right", fontsize=7)
    ax.set_ylabel(label)
    if not series:
        ax.text(
            0.5,
            0.5,
            f"{label}: n/a (not in metrics.jsonl)",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="#777777",
        )
    return bool(series)


def _valid_line(ax: Axes, metrics: Metrics, t0: float, unit: float) -> bool:
    """The held-out loss (valid_loss) on the loss panel: its own line and points, per attempt."""
    series = _series(metrics, "valid_loss", t0, unit)
    for i, (_attempt, (xs, ys)) in enumerate(sorted(series.items())):
        ax.plot(xs, ys, lw=1.2, color="#ff7f0e", marker="o", ms=3, label=None if i else "valid")
    if series:
        ax.text(
            0.01, 0.92, "blue: train loss, orange: valid_loss", transform=ax.transAxes, fontsize=7
        )
    return bool(series)


def _cumulative(ax: Axes, a: Analysis, t0: float, unit: float) -> None:
    """Share of elapsed wall time per part, stacked to 100% (the bottom band is running goodput);
    the user's pauses are left out of the elapsed time, as goodput leaves them out."""
    import numpy as np

    segs = a.segments
    bounds = np.array([segs[0].start] + [s.end for s in segs])
    grid = np.linspace(bounds[0], bounds[-1], 800)[1:]

    def cumulative(part: str) -> np.ndarray:
        inc = np.array([s.end - s.start if s.part == part else 0.0 for s in segs])
        out: np.ndarray = np.interp(grid, bounds, np.concatenate([[0.0], np.cumsum(inc)]))
        return out

    counted = np.maximum(grid - bounds[0] - cumulative("user_paused"), 1e-9)
    stack = [p for p in STACK if p != "user_paused"]
    shares = [100 * cumulative(p) / counted for p in stack]
    g = a.goodput
    labels = [f"{LABELS[p]} {100 * getattr(g, p) / (g.counted or 1):.1f}%" for p in stack]
    ax.stackplot((grid - t0) / unit, *shares, colors=[PART_COLORS[p] for p in stack], labels=labels)
    ax.set_ylim(0, 100)
    ax.set_ylabel("share of wall %")
    paused = f", paused by you {format_duration(g.user_paused)} left out" if g.user_paused else ""
    title = f"goodput {100 * g.goodput:.1f}% (cumulative breakdown{paused})"
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)


def _strip(ax: Axes, a: Analysis, t0: float, unit: float) -> None:
    for part in PARTS:
        bars = [
            ((s.start - t0) / unit, (s.end - s.start) / unit) for s in a.segments if s.part == part
        ]
        if bars:
            hatch = PAUSE_HATCH if part == "user_paused" else None
            ax.broken_barh(bars, (0, 1), facecolors=PART_COLORS[part], hatch=hatch)
    ax.set_yticks([])
    ax.set_ylabel("timeline", rotation=0, ha="right", va="center")


def _pauses(axes: Sequence[Axes], a: Analysis, t0: float, unit: float) -> list[Patch]:
    """The user's pauses as grey hatched spans on the wall-time panels."""
    from matplotlib.patches import Patch

    spans = [s for s in a.segments if s.part == "user_paused"]
    face, edge = PART_COLORS["user_paused"], "#999999"
    for ax in axes:
        for s in spans:
            x0, x1 = (s.start - t0) / unit, (s.end - t0) / unit
            ax.axvspan(x0, x1, lw=0, alpha=0.6, facecolor=face, edgecolor=edge, hatch=PAUSE_HATCH)
    label = "paused by you (not in goodput)"
    return [Patch(facecolor=face, edgecolor=edge, hatch=PAUSE_HATCH, label=label)] if spans else []


def class_color(cls: str) -> str:
    """A failure class's marker colour (events.TRAITS)."""
    return CLASS_COLORS.get(cls, UNKNOWN_CLASS_COLOR)


def _markers(
    axes: Sequence[Axes],
    ledger: Sequence[Row],
    t0: float,
    unit: float,
    thinned: Optional[Thinned] = None,
) -> list[Line2D]:
    """Attempts, requeues, failures and the checkpoints `thinned` keeps (default: thinned here)."""
    from matplotlib.lines import Line2D

    thinned = thinned or thin_checkpoints(ledger)
    seen: dict[str, Line2D] = {}
    drawn = {id(e) for e in thinned.rows}
    for e in ledger:
        style: Style
        if isinstance(e, events.Failed):
            cls = e.cls or "?"
            style, name = Style(color=class_color(cls), ls="-", lw=1.6), f"failed: {cls}"
        elif type(e) in MARKERS:
            style, name = MARKERS[type(e)]
        elif id(e) in drawn:
            style, name = CKPT_STYLE, thinned.label
        else:
            continue
        t = e.time
        color, ls, lw, alpha = style["color"], style["ls"], style["lw"], style.get("alpha")
        for ax in axes:
            ax.axvline((t - t0) / unit, color=color, ls=ls, lw=lw, alpha=alpha)
        seen.setdefault(name, Line2D([], [], color=color, ls=ls, lw=lw, alpha=alpha, label=name))
    return list(seen.values())


def _efficiency(ax: Axes, metrics: Metrics, t0: float, unit: float) -> None:
    """MFU in %, else TFLOP/s per GPU, else an n/a note."""
    if any(isinstance(m.get("mfu"), (int, float)) for m in metrics):
        vals = [v for m in metrics if isinstance(v := m.get("mfu"), (int, float))]
        scale = 100.0 if max(vals) <= 1.0 else 1.0
        _metric_panel(ax, metrics, "mfu", "MFU %", t0, unit, scale=scale)
    elif any(isinstance(m.get("tflops_per_gpu"), (int, float)) for m in metrics):
        _metric_panel(ax, metrics, "tflops_per_gpu", "TFLOP/s/GPU", t0, unit)
        ax.text(0.01, 0.9, "MFU n/a: showing TFLOP/s per GPU", transform=ax.transAxes, fontsize=7)
    else:
        _metric_panel(ax, metrics, "mfu", "MFU", t0, unit)


def _legend(ax: Axes, handles: Sequence[Artist]) -> None:
    if handles:
        ax.legend(
            handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False
        )


def _axes(fig: Figure) -> tuple[list[Axes], list[Axes]]:
    """Two step-axis panels (loss, learning rate) above five wall-time panels (loss, tokens/s,
    MFU, cumulative goodput, timeline strip); each group shares its x axis."""
    grid = fig.add_gridspec(8, 1, height_ratios=[3, 1.4, 0.2, 2, 2, 2, 3, 0.5])
    loss = fig.add_subplot(grid[0])
    by_step = [loss, fig.add_subplot(grid[1], sharex=loss)]
    first = fig.add_subplot(grid[3])
    by_wall = [first] + [fig.add_subplot(grid[i], sharex=first) for i in (4, 5, 6, 7)]
    for ax in [by_step[0], *by_wall[:-1]]:
        ax.tick_params(labelbottom=False)
    return by_step, by_wall


def plot(run_dir: Path, out: Path, a: Analysis, ledger: Rows, metrics: Metrics) -> Path:
    """Write the report PNG to `out` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = a.goodput
    t0 = g.start
    unit, unit_name = _unit(g.wall)
    fig = plt.figure(figsize=(12, 15))
    (ax_step, ax_lr), wall_axes = _axes(fig)
    ax_loss, ax_tps, ax_mfu, ax_cum, ax_strip = wall_axes
    _legend(ax_step, step_panels(ax_step, ax_lr, metrics, ledger, a.lost_records))
    ax_step.set_title("by step", fontsize=9, loc="left")
    _metric_panel(ax_loss, metrics, "loss", "loss", t0, unit, lost=a.lost_records)
    _valid_line(ax_loss, metrics, t0, unit)
    ax_loss.set_title(f"by wall time ({unit_name})", fontsize=9, loc="left")
    _metric_panel(ax_tps, metrics, "tokens_per_s", "tokens/s", t0, unit)
    _efficiency(ax_mfu, metrics, t0, unit)
    if a.segments:
        _cumulative(ax_cum, a, t0, unit)
        _strip(ax_strip, a, t0, unit)
    markers = _markers(wall_axes[:4], ledger, t0, unit)
    _legend(ax_loss, [*markers, *_pauses(wall_axes[:4], a, t0, unit)])
    ax_strip.set_xlabel(f"wall time since first record ({unit_name})")
    ax_strip.set_xlim(0, max(g.wall / unit, 1e-9))
    live = " (live)" if g.live else ""
    fig.suptitle(
        f"{run_dir}  ·  {g.attempts} attempts  ·  goodput {100 * g.goodput:.1f}%{live}", fontsize=10
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="slurmtrain report",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="example: slurmtrain report licenses   (a name: its newest run)\n"
        "         slurmtrain report runs/demo/3f2a9c1e77b0 --live --out /tmp/demo.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help=run_arg.HELP)
    p.add_argument("--out", type=Path, default=None, help="PNG path (default RUN_DIR/report.png)")
    p.add_argument("--live", action="store_true", help="count a queued/running run up to now")
    p.add_argument("--runs-root", default=None, help="where run names are looked up")
    args = p.parse_args(argv)
    run = run_arg.one(args.run, "report", args.runs_root)
    if run is None:
        return 2
    rd = RunDir(run)
    if not rd.ledger_files() and not rd.metrics.exists():
        print(
            f"run_dir={run}: no ledger (ledger.d/) or metrics.jsonl there; pass a run directory "
            f"(<runs_root>/<name>/<fingerprint>)",
            file=sys.stderr,
        )
        return 2
    import time

    ledger, metrics = ledger_rows(rd), read_jsonl(rd.metrics)  # one failure per start
    a = analyze(ledger, metrics, now=time.time() if args.live else None)
    print(summary(run, a, ledger, metrics))
    print("\n".join(node_panel(ledger)) or "no straggler seen")  # per node (report_stragglers.py)
    out = plot(run, args.out or run / "report.png", a, ledger, metrics)
    print(f"\nwrote {out}")
    read_skips.warn("report", run)  # one line for every unreadable file or line skipped
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
