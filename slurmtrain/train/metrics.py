"""Metrics: rank 0 appends one JSON line per logged step, and prints a one-line summary on clusters.

The local launcher turns metrics.jsonl into a rich progress bar on the login side, so workers never
draw to a terminal they do not own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

from slurmtrain.runs import append_jsonl


class MetricsWriter:
    def __init__(self, path: Path, enabled: bool, attempt: int, tensorboard_dir: Optional[Path],
                 print_lines: bool) -> None:
        self.path, self.enabled, self.attempt = path, enabled, attempt
        self.print_lines = print_lines
        self.tb = None
        if enabled and tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:  # tensorboard is optional on the compute node
                self.tb = None

    def log(self, step: int, max_steps: int, **values: Any) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), "attempt": self.attempt, **values}
        append_jsonl(self.path, row)
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, step)
        if self.print_lines:
            print(f"step {step}/{max_steps} loss {values.get('loss', float('nan')):.4f} "
                  f"lr {values.get('lr', 0):.2e} tok/s {values.get('tokens_per_s', 0):,.0f} "
                  f"step {values.get('step_time', 0):.3f}s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
