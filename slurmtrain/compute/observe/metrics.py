"""Metrics: rank 0 appends one flat JSON line per logged step, mirrors every number to TensorBoard,
and prints a one-line summary (what a Slurm user tails in the job's log).

The local launcher turns metrics.jsonl into a rich progress bar on the login side, so workers never
draw to a terminal they do not own. Rows are written once per `train.log_interval` steps, and a row
is one TensorBoard event holding all its scalars (one `add_scalar` per value costs ~60 us each,
~1 ms a row: 3% of a tiny model's step at log_interval=1).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

from slurmtrain.common.rundir import append_jsonl
from slurmtrain.planning.eta import format_duration


def summary_line(step: int, max_steps: int, values: dict[str, Any]) -> str:
    """One line a Slurm user tails, e.g. `step 40/200 loss 4.1200 lr 1.00e-03 tok/s 21,000
    step 0.049s TFLOPS/GPU 0.0123 MFU 41.2% ETA 0:00:08` (MFU - without a known peak: CPUs), then
    `valid_loss 4.3000` on the steps that evaluated the held-out set (valid_ppl: in the row)."""
    mfu = values.get("mfu")
    tflops = values.get("tflops_per_gpu")
    eta = values.get("eta_s")
    return (
        f"step {step}/{max_steps} loss {values.get('loss', float('nan')):.4f} "
        f"lr {values.get('lr', 0):.2e} tok/s {values.get('tokens_per_s', 0):,.0f} "
        f"step {values.get('step_time', 0):.3f}s "
        f"TFLOPS/GPU {'-' if tflops is None else f'{tflops:.3g}'} "
        f"MFU {'-' if mfu is None else f'{100 * mfu:.1f}%'} "
        f"ETA {'-' if eta is None else format_duration(eta, clock=True)}"
        + (f" valid_loss {valid:.4f}" if (valid := values.get("valid_loss")) is not None else "")
    )


PER_RANK_TAGS = 64  # wider lists get key/min, key/median, key/max instead of one tag per rank


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalars(values: dict[str, Any]) -> dict[str, float]:
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
        trackers: Any = None,
    ) -> None:
        self.path, self.enabled, self.attempt = path, enabled, attempt
        self.print_lines = print_lines
        self.trackers = trackers  # rank 0's W&B/MLflow (observe/trackers.py), or None
        self.tb: Any = None
        if enabled and tensorboard_dir is not None:
            try:
                from tensorboard.compat.proto.summary_pb2 import Summary
                from torch.utils.tensorboard.writer import FileWriter

                self.tb, self._summary = FileWriter(str(tensorboard_dir)), Summary
            except ImportError:  # tensorboard is optional on the compute node
                self.tb = None

    def log(self, step: int, max_steps: int, **values: Any) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), "attempt": self.attempt, **values}
        append_jsonl(self.path, row)
        if self.tb is not None:
            value = self._summary.Value
            self.tb.add_summary(
                self._summary(
                    value=[value(tag=k, simple_value=v) for k, v in scalars(values).items()]
                ),
                step,
            )
        if self.trackers is not None:
            self.trackers.log(step, scalars(values))
        if self.print_lines:
            print(summary_line(step, max_steps, values), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def finish(self) -> None:
        """After the attempt's outcome is recorded: the trackers get its last events and close."""
        self.close()
        trackers, self.trackers = self.trackers, None
        if trackers is not None:
            trackers.close()
