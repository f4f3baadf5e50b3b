"""Metrics: rank 0 appends one flat JSON line per logged step, mirrors every number to TensorBoard,
and prints a one-line summary (what a Slurm user tails in the job's log).

The local launcher turns metrics.jsonl into a progress bar on the login side, so workers never draw
to a terminal they do not own. A row is one TensorBoard event holding all its scalars: one
`add_scalar` per value would cost a noticeable share of a tiny model's step.
"""

from __future__ import annotations

import numbers
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, TypeGuard, Union

from slurmtrain.common.jsonl import append_jsonl
from slurmtrain.planning.eta import format_duration

if TYPE_CHECKING:
    from torch.utils.tensorboard.writer import FileWriter

    from slurmtrain.common.events import Row
    from slurmtrain.compute.observe.trackers import Trackers

# A metrics row's value: a number, a per-rank list, or None (not measured this interval)
MetricValue = Union[float, None, Sequence[float]]


def _number(value: object) -> TypeGuard[Union[int, float]]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _float(values: Mapping[str, MetricValue], key: str) -> Optional[float]:
    value = values.get(key)
    return float(value) if isinstance(value, numbers.Real) else None  # numpy scalars too


def summary_line(step: int, max_steps: int, values: Mapping[str, MetricValue]) -> str:
    """One line a Slurm user tails, e.g. `step 40/200 loss 4.1200 lr 1.00e-03 tok/s 21,000
    step 0.049s TFLOPS/GPU 0.0123 MFU 41.2% ETA 0:00:08` (MFU - without a known peak: CPUs), then
    `valid_loss 4.3000` on the steps that evaluated the held-out set (valid_ppl: in the row)."""
    mfu, tflops, eta = (_float(values, k) for k in ("mfu", "tflops_per_gpu", "eta_s"))
    loss, valid = _float(values, "loss"), _float(values, "valid_loss")
    return (
        f"step {step}/{max_steps} loss {float('nan') if loss is None else loss:.4f} "
        f"lr {_float(values, 'lr') or 0:.2e} tok/s {_float(values, 'tokens_per_s') or 0:,.0f} "
        f"step {_float(values, 'step_time') or 0:.3f}s "
        f"TFLOPS/GPU {'-' if tflops is None else f'{tflops:.3g}'} "
        f"MFU {'-' if mfu is None else f'{100 * mfu:.1f}%'} "
        f"ETA {'-' if eta is None else format_duration(eta, clock=True)}"
        + (f" valid_loss {valid:.4f}" if valid is not None else "")
    )


HEARTBEAT_S = 20.0  # rank 0 prints a line at least this often between logged steps (a log file)
PER_RANK_TAGS = 64  # wider lists get key/min, key/median, key/max instead of one tag per rank


def scalars(values: Mapping[str, MetricValue]) -> dict[str, float]:
    """Every number of a row as a TensorBoard scalar; a list becomes one tag per rank (key/rankN)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, (list, tuple)):
            items = [float(v) for v in value if _number(v)]
            if len(items) > PER_RANK_TAGS:
                out.update(
                    {
                        f"{key}/min": min(items),
                        f"{key}/median": statistics.median(items),
                        f"{key}/max": max(items),
                    }
                )
            else:
                out.update({f"{key}/rank{i}": v for i, v in enumerate(items)})
        elif _number(value):
            out[key] = float(value)
    return out


class MetricsWriter:
    def __init__(
        self,
        path: Path,
        enabled: bool,
        attempt: int,
        tensorboard_dir: Optional[Path],
        print_lines: bool,
        trackers: Optional[Trackers] = None,
        record: Optional[Callable[[Row], object]] = None,
    ) -> None:
        self.path, self.enabled, self.attempt = path, enabled, attempt
        self.print_lines = print_lines
        self._printed: Optional[tuple[int, float]] = None  # (step, monotonic time) last printed
        self.trackers = trackers  # rank 0's W&B/MLflow (observe/trackers.py), or None
        self.record = record  # the attempt's ledger: a failing TensorBoard's `tracker_failed`
        self.tb: Optional[FileWriter] = None
        if enabled and tensorboard_dir is not None:
            try:
                from tensorboard.compat.proto.summary_pb2 import (  # type: ignore[import-untyped]  # no type hints
                    Summary,
                )
                from torch.utils.tensorboard.writer import FileWriter
            except ImportError:  # tensorboard is optional on the compute node
                return
            try:
                self.tb, self._summary = FileWriter(str(tensorboard_dir)), Summary
            except Exception as err:  # noqa: BLE001  a tracker never stops training
                self._tb_failed("open", err)

    def log(self, step: int, max_steps: int, **values: MetricValue) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), "attempt": self.attempt, **values}
        append_jsonl(self.path, row)
        if self.tb is not None:
            value = self._summary.Value
            try:
                self.tb.add_summary(
                    self._summary(
                        value=[value(tag=k, simple_value=v) for k, v in scalars(values).items()]
                    ),
                    step,
                )
            except Exception as err:  # noqa: BLE001  its writer thread's error surfaces here
                self._tb_failed("write", err)
        if self.trackers is not None:
            self.trackers.log(step, scalars(values))
        if self.print_lines:
            print(summary_line(step, max_steps, values), file=sys.stderr, flush=True)
            self._printed = (step, time.monotonic())

    def heartbeat(self, step: int, max_steps: int, tokens_per_step: int, **values: float) -> None:
        """A step that is not logged: rank 0 prints its line anyway once HEARTBEAT_S passed since
        the last one, with the rate and ETA of its own clock over the steps since (no collective,
        nothing written): a log of slow steps or a long log_interval still moves every 30 s."""
        if not (self.enabled and self.print_lines):
            return
        now = time.monotonic()
        last_step, last_time = self._printed or (step, now)
        if self._printed is None or now - last_time < HEARTBEAT_S:
            self._printed = self._printed or (step, now)
            return
        per_step = (now - last_time) / max(1, step - last_step)
        values = {
            **values,
            "tokens_per_s": tokens_per_step / per_step,
            "step_time": per_step,
            "eta_s": (max_steps - step) * per_step,
        }
        print(summary_line(step, max_steps, values), file=sys.stderr, flush=True)
        self._printed = (step, now)

    def close(self) -> None:
        if self.tb is not None:
            try:
                self.tb.close()
            except Exception as err:  # noqa: BLE001  the last events' flush
                self._tb_failed("close", err)
            self.tb = None

    def _tb_failed(self, phase: str, err: BaseException) -> None:
        """TensorBoard is dropped like any tracker (observe/trackers.py): a warning, a row."""
        from slurmtrain.compute.observe.trackers import report_failure

        self.tb = None
        report_failure("tensorboard", phase, err, self.record)

    def finish(self) -> None:
        """After the attempt's outcome is recorded: the trackers get its last events and close."""
        self.close()
        trackers, self.trackers = self.trackers, None
        if trackers is not None:
            trackers.close()
