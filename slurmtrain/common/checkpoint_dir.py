"""`checkpoint.dir`: checkpoints on another filesystem (scratch, flash) than the run directory.

The run directory keeps config, ledger, logs and provenance where runs_root is; its `checkpoints`
entry becomes a symbolic link to `<checkpoint.dir>/<name>/<fingerprint>/`. Every reader and writer
(save, resume, fallback, purge, export, sample, branch, status) goes through RunDir.checkpoints,
so all of them follow the link; every rename of the checkpoint protocol stays inside that one
directory (one filesystem). The run's lock still lives in the run directory: one owner per run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from slurmtrain.common import ownership
from slurmtrain.common.errors import ConfigError


def target(checkpoint_dir: Optional[str], run_path: Path) -> Optional[Path]:
    """Where checkpoint.dir keeps this run's checkpoints (None: in the run directory)."""
    if not checkpoint_dir:
        return None
    return Path(checkpoint_dir).expanduser().resolve() / run_path.parent.name / run_path.name


def check_value(checkpoint_dir: Optional[str], runs_root: str) -> None:
    """The key's value at login, before anything is written: absolute, outside runs_root."""
    if not checkpoint_dir:
        return
    given = Path(checkpoint_dir).expanduser()
    if not given.is_absolute():
        raise ConfigError(
            f"checkpoint.dir={checkpoint_dir!r}: an absolute path (the batch script runs "
            f"elsewhere), e.g. checkpoint.dir=/scratch/$USER/checkpoints"
        )
    root = Path(runs_root).expanduser().resolve()
    if given.resolve() == root or root in given.resolve().parents:
        raise ConfigError(
            f"checkpoint.dir={checkpoint_dir!r} is inside runs_root={runs_root!r}: checkpoints "
            f"are there already; drop checkpoint.dir or point it at another filesystem"
        )


def link(run_path: Path, checkpoint_dir: Optional[str], mode: int = 0o700) -> None:
    """Make RUN/checkpoints the link to the run's checkpoint directory (created), or check that
    it is one. Refused in one line where the run already keeps checkpoints elsewhere: moving
    them is the user's decision, never ours."""
    where = target(checkpoint_dir, run_path)
    if where is None:
        return
    entry = run_path / "checkpoints"
    if entry.is_symlink():
        if Path(os.readlink(entry)) != where:
            raise ConfigError(
                f"checkpoint.dir={checkpoint_dir!r}: this run keeps its checkpoints in "
                f"{os.readlink(entry)}; move them to {where} and relink ({entry}), or pass "
                f"checkpoint.dir={Path(os.readlink(entry)).parent.parent}"
            )
    elif entry.exists():
        if any(entry.iterdir()):
            raise ConfigError(
                f"checkpoint.dir={checkpoint_dir!r}: this run keeps its checkpoints in {entry}; "
                f"move them to {where} (mv {entry}/* {where}/) and remove {entry}, or drop "
                f"checkpoint.dir"
            )
        entry.rmdir()  # made empty by an earlier submission without checkpoint.dir
    try:
        # made with the run's mode, refused when another user made it (common/ownership.py)
        ownership.make_dir(where, mode, "checkpoint directory")
        if not entry.is_symlink():
            os.symlink(where, entry, target_is_directory=True)
    except OSError as err:
        raise ConfigError(
            f"checkpoint.dir={checkpoint_dir!r}: cannot use {where} ({err.strerror}); use a "
            f"directory you can write"
        ) from None
