"""Before a Slurm run is prepared: refuse what this cluster's partitions cannot run."""

from __future__ import annotations

import functools
from typing import Optional

from slurmtrain.common import slurm_cmd, slurm_text
from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.slurm_text import PartitionInfo
from slurmtrain.login import flags, placement
from slurmtrain.planning import policy
from slurmtrain.planning.shapes import params_of


@functools.lru_cache(maxsize=1)
def partitions() -> dict[str, PartitionInfo]:
    """The cluster's partitions, asked once per process (a sweep checks every point): those the
    cluster=auto probe read already, else Slurm's answer now."""
    known = placement.probe_slurm().partitions
    return known if known is not None else slurm_cmd.query_partitions()


def check_cluster(cfg: RootConfig, checked: Optional[RootConfig] = None) -> None:
    """Refuse, before anything is queued, what this cluster's partitions cannot run. `checked`:
    the config's view with its derived numbers (login/prepare.snapshot); `cfg` is what a
    cluster.time=auto planned again is written to."""
    numbers = derived_of(checked if checked is not None else cfg)
    try:
        known = partitions()
    except slurm_text.SlurmError as err:
        raise ConfigError(
            f"cluster.kind=slurm: cannot reach Slurm ({err}); run on a login node "
            f"or use cluster=local"
        ) from None
    part = placement.chosen_partition(cfg.cluster.partition, known)
    policy.replan_time(cfg, part)  # cluster.time=auto planned without the partition: its MaxTime
    spares = int(cfg.faults.spare_nodes)
    errors = slurm_text.validate_request(
        cfg.cluster.partition,
        numbers.nodes[1] + spares,
        cfg.cluster.time,
        cfg.gpus_per_node,
        known,
        keys={
            "nodes": "nodes+faults.spare_nodes" if spares else "nodes",
            "gpus_per_node": "gpus_per_node",
        },
    )
    if errors:
        raise ConfigError(errors[0])
    if part is not None:
        refused = flags.cpu_plan_refusal(
            cfg, part, numbers.params or params_of(cfg), _insisted_cpu()
        )
        if refused:
            raise ConfigError(refused)


def _insisted_cpu() -> bool:
    """Did the user pass gpus_per_node=0 (not `auto` resolved to 0)? Read from Hydra's
    overrides of this command; False outside Hydra's main."""
    try:
        from hydra.core.hydra_config import HydraConfig  # optional: absent outside Hydra's main

        given = list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        return False
    return any(o.lstrip("+").replace(" ", "") == "gpus_per_node=0" for o in given)
