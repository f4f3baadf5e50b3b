"""The `logger` section of the schema: which experiment trackers mirror the metrics (conf/logger/).

Not part of the fingerprint (schema.NON_RESULT_KEYS): trackers do not change the weights, and a
run given `logger=wandb` on its next submission must stay the same run (and the same W&B run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from slurmtrain.common.schema_cluster import StrEnum


class WandbMode(StrEnum):
    # Compute nodes seldom reach the internet: offline writes under RUN_DIR/wandb/, uploaded by
    # `python -m slurmtrain.cli sync RUN_DIR`.
    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class TensorboardLogger:
    pass  # events under RUN_DIR/tensorboard/attempt_N/ (nothing to set)


@dataclass
class WandbLogger:
    mode: WandbMode = WandbMode.offline
    project: str = "slurmtrain"
    entity: Optional[str] = None
    id: Optional[str] = None  # None: <name>-<fingerprint>, one W&B run for every attempt
    tags: list[str] = field(default_factory=list)


@dataclass
class MlflowLogger:
    # None: a file store in RUN_DIR/mlruns (no server); or the user's URI (http://, databricks...)
    tracking_uri: Optional[str] = None
    experiment: str = "slurmtrain"


@dataclass
class LoggerConfig:
    # A tracker is on when its section is present: `logger=wandb`, `logger=[tensorboard,mlflow]`
    # (conf/logger/). None of them (a config.yaml written before this section): TensorBoard.
    tensorboard: Optional[TensorboardLogger] = None
    wandb: Optional[WandbLogger] = None
    mlflow: Optional[MlflowLogger] = None
