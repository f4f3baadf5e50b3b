"""The login side's config: Hydra's composed DictConfig, read through the schema it was built from."""

from __future__ import annotations

from typing import cast

from omegaconf import DictConfig

from slurmtrain.common.schema import RootConfig


def typed(cfg: DictConfig) -> RootConfig:
    """`cfg` for code typed against the schema. Hydra composed it against the registered
    RootConfig (schema.register), so its attributes are RootConfig's and OmegaConf checks every
    assignment at run time (Hydra's documented pattern for structured configs)."""
    return cast(RootConfig, cfg)
