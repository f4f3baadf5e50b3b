"""Hydra's per-run record (hydra.output_subdir's config.yaml, hydra.yaml, overrides.yaml) written
with every secret as a reference, mode 0600, when a user turns it on.

conf/config.yaml sets hydra.output_subdir to null: Hydra writes nothing. A user who sets it (say
`hydra.output_subdir=.hydra`) would get Hydra's three files with secrets' values in clear, so this
callback (conf/config.yaml's hydra.callbacks) writes them itself before Hydra's run_job would, and
turns Hydra's own writing off for that run. A sweep's record is the sweeper's (sweeper.py).
"""

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write


class RedactedRecord(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        subdir = OmegaConf.select(config, "hydra.output_subdir")
        if subdir is None:
            return
        from slurmtrain.common import secrets  # start-up speed: only when the record is on
        from slurmtrain.common.durable import replace_atomically

        HydraConfig.instance().set_config(config)  # as run_job does first: ${hydra:...} resolve
        folder = Path(str(config.hydra.run.dir)) / str(subdir)
        data = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
        assert isinstance(data, dict)
        task = secrets.redacted_hydra({str(k): v for k, v in data.items()})
        hydra = task.pop("hydra")
        assert isinstance(hydra, dict)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, part in (
            ("config.yaml", task),
            ("hydra.yaml", {"hydra": hydra}),
            ("overrides.yaml", hydra["overrides"]["task"]),
        ):
            text = OmegaConf.to_yaml(OmegaConf.create(part))
            replace_atomically(folder / name, text, mode=0o600, durable=False, exact_mode=True)
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.output_subdir = None  # run_job: written already, redacted
