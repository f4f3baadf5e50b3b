"""The one line every attempt that loads a checkpoint prints: where it resumed from.

`slurmtrain: resumed from step_40 (/runs/demo/ab12/checkpoints/step_40, saved 3m20s ago)`. Rank 0
prints it in the job's log when the checkpoint is loaded (compute/trainer.py); the local launcher
prints it on the login side too, from the ledger's `checkpoint_loaded` row (login/local_submit.py).
"""

from __future__ import annotations

import time
from typing import Optional

from slurmtrain.planning.eta import format_duration


def resumed_line(
    step: object,
    path: object,
    saved_at: object,
    now: Optional[float] = None,
    universal: bool = False,
) -> str:
    """`saved_at`: the checkpoint's save time (its manifest's `time`, or its `checkpoint_saved`
    row's); None leaves the age out. `universal`: loaded on another world size."""
    parts = [str(path)]
    if isinstance(saved_at, (int, float)) and saved_at > 0:
        age = (time.time() if now is None else now) - float(saved_at)
        parts.append(f"saved {format_duration(age)} ago")
    if universal:
        parts.append("another world size: through the universal checkpoint")
    return f"slurmtrain: resumed from step_{step} ({', '.join(parts)})"
