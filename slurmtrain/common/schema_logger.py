"""The `logger` section of the schema: which experiment trackers mirror the metrics (conf/logger/).

One optional section per tracker in common/tracker_registry.py (its dataclass is in its module,
common/tracker_<name>.py), besides TensorBoard's. Not part of the fingerprint
(schema.NON_RESULT_KEYS): trackers do not change the weights, and a run given `logger=wandb` on
its next submission must stay the same run (and the same W&B run).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, make_dataclass
from typing import TYPE_CHECKING, Any, Optional

from slurmtrain.common.tracker_registry import trackers

# schema.py's name for it (tests compose logger.wandb.mode); found, as the registry finds modules,
# by name: common/tracker_wandb.py imports what imports the schema
WandbMode = importlib.import_module("slurmtrain.common.tracker_wandb").WandbMode

__all__ = ["LoggerConfig", "TensorboardLogger", "WandbMode"]


@dataclass
class TensorboardLogger:
    pass  # events under RUN_DIR/tensorboard/attempt_N/ (nothing to set)


def _sections() -> list[tuple[str, Any, Any]]:
    """A tracker is on when its section is present: `logger=wandb`, `logger=[tensorboard,mlflow]`
    (conf/logger/). None of them (a config.yaml written before this section): TensorBoard."""
    out: list[tuple[str, Any, Any]] = [
        ("tensorboard", Optional[TensorboardLogger], field(default=None))
    ]
    for t in trackers():
        out.append((t.name, Optional[t.section], field(default=None)))
    return out


if TYPE_CHECKING:

    @dataclass
    class LoggerConfig:
        tensorboard: Optional[TensorboardLogger] = None

        def __getattr__(self, name: str) -> Any: ...  # a tracker's section (registry)

else:
    LoggerConfig = make_dataclass("LoggerConfig", _sections())
    LoggerConfig.__module__ = __name__  # pickled by name (make_dataclass's module=: 3.12)
