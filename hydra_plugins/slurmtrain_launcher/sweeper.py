"""Hydra's basic sweeper minus its pre-flight composition of every point.

BasicSweeper composes each sweep point once to check it before handing the batch to the launcher,
which then composes it again: ~80 ms a point, 5 s for 64. The slurmtrain launcher composes and
validates every point itself before queueing anything, so the first pass is dropped. And Hydra's
one file, `multirun.yaml` (under hydra.sweep.dir), records the command with every secret as a
reference, like config.yaml (common/secrets.py), dry runs included; mode 0600 (its owner's).
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


@dataclass
class SlurmtrainSweeperConf:
    _target_: str = "hydra_plugins.slurmtrain_launcher.sweeper.SlurmtrainSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="slurmtrain", node=SlurmtrainSweeperConf, provider="slurmtrain"
)


class SlurmtrainSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Every point is composed and validated by the launcher before anything is submitted."""

    def sweep(self, arguments: List[str]) -> Any:
        """BasicSweeper's sweep, which writes multirun.yaml from `self.config` (and reads only its
        hydra.sweep.dir besides): that is the redacted copy meanwhile; the launcher composes the
        points from its own, the real one."""
        from slurmtrain.common import ownership, secrets  # start-up: Hydra imports every plugin

        config = self.config
        assert config is not None
        data = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
        assert isinstance(data, dict)
        self.config = DictConfig(secrets.redacted_hydra({str(k): v for k, v in data.items()}))
        mode = ownership.dir_mode(config.get("run_dir_mode"))
        _owner_only(Path(str(self.config.hydra.sweep.dir)) / "multirun.yaml", mode)
        try:
            return super().sweep(arguments)
        finally:
            self.config = config


def _owner_only(path: Path, mode: int) -> None:
    """`path` made (empty) or kept with mode 0600 before Hydra writes it: its `open(..., "w")`
    keeps an existing file's mode, whatever the umask. Its directory (and runs_root) made with
    run_dir_mode, or refused when another user made it (common/ownership.py)."""
    from slurmtrain.common import ownership

    ownership.make_dir(path.parent, mode, "sweep directory")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
