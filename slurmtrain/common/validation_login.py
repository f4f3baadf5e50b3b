"""Checks of the whole config whatever the cluster kind: keys the schema lacks, every cluster.*
value (a config planned for cluster=local may be moved to Slurm by hand), the run directory's mode
and a runs_root that can take run directories.

Each failure is one ConfigError line naming the key, the value and the fix; called by
validation.validate_config on the login node before anything is written or queued.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import tempfile
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from slurmtrain.common import checkpoint_dir, tracker_registry
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.schema_keys import key_tree, unknown_key
from slurmtrain.common.secrets import is_secret_key, reference, secret_keys
from slurmtrain.common.slurm_text import parse_time
from slurmtrain.common.validation_container import check_container


def check_all(cfg: RootConfig) -> None:
    if isinstance(cfg, DictConfig):  # only a composed config can carry keys the schema lacks
        check_known_keys(cfg)
    check_cluster_values(cfg)
    check_setup(cfg.cluster.setup)
    checkpoint_dir.check_value(cfg.checkpoint.dir, str(cfg.runs_root))
    check_local_dir(cfg.checkpoint.local_dir)
    check_container(cfg)  # container keys, every runtime (common/validation_container.py)
    check_run_dir_mode(cfg.run_dir_mode)
    check_deepspeed_secrets(cfg)
    check_runs_root(str(cfg.runs_root))
    check_trackers(cfg)


def check_local_dir(value: object) -> None:
    """checkpoint.local_dir: each node's own storage, absolute (the batch script runs elsewhere)."""
    if value and not Path(str(value)).is_absolute():
        raise ConfigError(
            f"checkpoint.local_dir={value!r}: an absolute path on each node's own storage, "
            f"e.g. checkpoint.local_dir=/local/ckpt-{{node}} (or drop it: $SLURM_TMPDIR, /dev/shm)"
        )


def check_known_keys(cfg: DictConfig) -> None:
    """Every key is one the schema has: Hydra's `+key=value` adds a key even to a struct config,
    and the workers' schema.load_run_config would refuse it. Walked against the schema's
    dataclasses (open dicts such as cluster.env take any key), which is far cheaper per sweep point
    than merging the config into the schema."""
    key = unknown_key(OmegaConf.to_container(cfg, resolve=False), key_tree(RootConfig))
    if key is None:
        return
    value = OmegaConf.select(cfg, key, default=None)
    if is_secret_key(key):  # a misspelt cluster.env.X: the error line is not a leak
        value = reference(key)
    # a whole section (+cluster.evn.X=1): named, its values not echoed
    given = f"{key}" if OmegaConf.is_config(value) else f"{key}={value!r}"
    raise ConfigError(
        f"{given}: not a slurmtrain setting; check the spelling (`python -m slurmtrain "
        f"--cfg job` lists every key) or drop it"
    )


def check_setup(setup: object) -> None:
    """cluster.setup: one string of lines, or a list of one-line strings (each becomes one line of
    job.sbatch, its exit code checked there)."""
    if setup is None or isinstance(setup, str):
        items: list[object] = [setup or ""]
    elif isinstance(setup, (list, tuple, ListConfig)):
        items = list(setup)
    else:
        raise ConfigError(
            f"cluster.setup={setup!r}: a list of shell lines, e.g. "
            f"'cluster.setup=[module load cuda/12.4,source $HOME/env.sh]'"
        )
    for i, line in enumerate(items):
        if not isinstance(line, str) or "\0" in line:
            raise ConfigError(f"cluster.setup[{i}]={line!r}: each entry is one shell line (text)")
        if isinstance(setup, (list, tuple, ListConfig)) and "\n" in line.strip():
            raise ConfigError(
                f"cluster.setup[{i}]={line!r}: one line per entry (its exit code is checked "
                f"line by line); split it into several entries"
            )


def check_cluster_values(cfg: RootConfig) -> None:
    """The Slurm times and srun arguments, for every kind (the #SBATCH values and environment
    names: login/prepare.resolve, through login/flags.py, the code that writes them)."""
    for key in ("cluster.time", "cluster.time_cap"):
        value = getattr(cfg.cluster, key.split(".")[1])
        if str(value) == "auto" and key == "cluster.time":
            continue
        try:
            parse_time(str(value))
        except ValueError:
            raise ConfigError(
                f"{key}={value!r}: not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS"
                f"{' or auto' if key == 'cluster.time' else ''}; e.g. {key}=24:00:00"
            ) from None
    for arg in cfg.cluster.srun_extra:
        if "\n" in str(arg) or "\r" in str(arg):
            raise ConfigError(f"cluster.srun_extra={str(arg)!r}: newlines are not allowed; fix it")


def check_deepspeed_secrets(cfg: RootConfig) -> None:
    """DeepSpeed stores its whole config in every checkpoint (and its monitors log it): a
    credential there (comet.api_key) would be written in clear. Its monitors read theirs from the
    environment too, which cluster.env gives the job without writing it anywhere."""
    extra: object = cfg.deepspeed.extra
    if isinstance(extra, DictConfig):
        extra = OmegaConf.to_container(extra, resolve=False)
    for path in sorted(p for p, _, _ in secret_keys(extra, "deepspeed.extra")):
        leaf = path.rsplit(".", 1)[-1]
        raise ConfigError(
            f"{path}: DeepSpeed writes its config into every checkpoint, so a secret there is "
            f"stored in clear; give it through the environment instead, e.g. "
            f"+cluster.env.{re.sub('[^A-Za-z0-9]+', '_', path.split('.')[2]).upper()}_"
            f"{leaf.upper()}=..."
        )


def check_run_dir_mode(mode: object) -> None:
    text = str(mode)
    bits = int(text, 8) if re.fullmatch(r"0?[0-7]{3}", text) else None
    if bits is None or bits & 0o700 != 0o700 or bits & 0o007:
        raise ConfigError(
            f"run_dir_mode={text!r}: must be an octal mode with rwx for the owner and nothing for "
            f"others (run directories hold the job's records); e.g. run_dir_mode=0750 or 0700"
        )


def check_runs_root(root: str) -> None:
    """runs_root can take run directories: its nearest existing ancestor is a directory we can
    create entries in (tried for real: root squash, read-only mounts and /proc all refuse). The
    probe is removed at once; a dry run writes nothing else either."""
    reason = _unwritable(os.path.abspath(root))
    if reason:
        raise ConfigError(
            f"runs_root={root!r}: cannot create run directories there ({reason}); use a "
            f"directory you can write, e.g. runs_root=$HOME/slurmtrain-runs"
        )


@functools.lru_cache(maxsize=16)
def _unwritable(root: str) -> str:
    """Why `root` cannot take new directories, or "" (asked once per process: a sweep's points
    share their runs_root)."""
    path = Path(root)
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return f"{path} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".slurmtrain-probe-", dir=path))
    except OSError as err:
        return f"{path}: {err.strerror}"
    return ""


def _installed(package: str) -> bool:
    """Whether `package` can be imported, without importing it (wandb takes ~1 s)."""
    return importlib.util.find_spec(package) is not None


def check_trackers(cfg: RootConfig) -> None:
    """The trackers `logger=` chose are installed here (the compute nodes share the venv): a
    missing extra fails before anything is queued, not on rank 0 (WandbMode checks W&B's mode).
    Each tracker names its import name and extra (common/tracker_registry.py)."""
    for t in tracker_registry.trackers():
        if getattr(cfg.logger, t.name, None) is not None and not _installed(t.package):
            raise ConfigError(
                f"logger={t.name}: the {t.package} package is not installed; "
                f"{t.install_line()} (or leave {t.name} out of logger=)"
            )
