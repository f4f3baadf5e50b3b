"""The run's config.yaml read from the shared tier once per node, not once per rank.

Every rank needs the config before the process group exists (its timeouts set up the rendezvous),
so it cannot be broadcast: the node's first rank to get here copies it into node-local memory
(/dev/shm, under a lock) and the node's other ranks read that copy; with 8 ranks a node the shared
filesystem sees one open in 8 (bench/restart_ops.py counts a restart's shared-tier reads). The copy
is keyed by run, job, restart, relaunch and node, so a later attempt reads the file again, and it
is removed once the rendezvous is done (every rank of the node read it before joining) or the
node's first rank exits; one a killed attempt left goes a day later. Anything
wrong with node-local memory, or no job id: each rank reads the shared file, as before.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

from slurmtrain.common import ownership
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig, load_run_config
from slurmtrain.common.slurm_text import attempt_counters
from slurmtrain.compute.distributed import Placement

ROOT_ENV = "SLURMTRAIN_NODE_CACHE"  # where the node-local copies go (default /dev/shm)


def local_copy(run: RunDir, where: Placement) -> Optional[Path]:
    """This attempt's node-local copy's path (None: no job id, nothing to key it by)."""
    if not where.job_id:
        return None
    restart, relaunch = attempt_counters(os.environ)
    key = f"{run.path}|{where.job_id}|{restart}|{relaunch}|{where.node}"
    base = Path(os.environ.get(ROOT_ENV) or "/dev/shm") / f"slurmtrain-{os.getuid()}"
    return base / f"config.{hashlib.sha1(key.encode()).hexdigest()[:16]}.yaml"


def load(run: RunDir, where: Placement) -> RootConfig:
    """The run's config: from the node-local copy (made by the node's first rank), else shared."""
    import fcntl

    local = local_copy(run, where)
    if local is None:
        return load_run_config(str(run.config))
    try:  # a predictable path: the per-user directory is checked ours and 0700 before any trust
        local.parent.parent.mkdir(parents=True, exist_ok=True)  # /dev/shm or ROOT_ENV's
        ownership.private_dir(local.parent)
        with open(local.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other ranks wait for the copy
            if not local.exists():
                tmp = local.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(run.config.read_bytes())
                os.replace(tmp, local)
                _sweep(local.parent)
        cfg = load_run_config(str(local))
    except (OSError, ConfigError):  # e.g. another user planted the directory: the shared file
        return load_run_config(str(run.config))
    if cfg.model.config and cfg.model.config.startswith(str(local.parent) + os.sep):
        # model=hf: the copy's relative config.json resolved against the run directory instead
        cfg.model.config = str(run.path / os.path.relpath(cfg.model.config, local.parent))
    return cfg


def forget(run: RunDir, where: Placement) -> None:
    """After the rendezvous (every rank of the node has read the copy), or as the node's first
    rank exits (a start that never met): the copy removed. (Another rank of the node still to
    read it makes a new one: one more read of the shared file.)"""
    local = local_copy(run, where)
    if local is None or where.local_rank != 0:
        return
    for path in (local, local.with_suffix(".lock")):
        try:
            path.unlink()
        except OSError:
            pass


def _sweep(directory: Path, age_s: float = 86400.0) -> None:
    """Copies a killed attempt left behind (a day old) go when a node makes a new one."""
    import time

    for path in directory.glob("config.*"):
        try:
            if path.stat().st_mtime < time.time() - age_s:
                path.unlink()
        except OSError:
            pass
