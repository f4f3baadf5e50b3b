"""One RUN argument, read the same way by every command that takes a run (logs, report, cancel,
sync, and export/sample through the dispatcher): a run directory, a name directory (`runs/NAME`),
a bare run name under the runs root (`$SLURMTRAIN_RUNS_ROOT`, else ./runs, or --runs-root), or a
glob of these (`'runs/lr_*'`). The matching is status_select.select's, the same as `status`.

A command that reads one run and is given several (a name whose config changed, a sweep) reads
the newest and says which on stderr; `cancel` decides for itself (it never guesses)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Union

from slurmtrain.cli import status_select
from slurmtrain.common.rundir import RunDir

HELP = (
    "a run directory (runs/NAME/FINGERPRINT), a run name under the runs root "
    "($SLURMTRAIN_RUNS_ROOT, else ./runs), a name directory (runs/NAME) or a glob of them"
)


def root(runs_root: Union[str, Path, None] = None) -> Path:
    """--runs-root, else $SLURMTRAIN_RUNS_ROOT, else ./runs (conf/config.yaml's default)."""
    return Path(runs_root or os.environ.get("SLURMTRAIN_RUNS_ROOT") or "runs").expanduser()


def resolve(arg: str, runs_root: Union[str, Path, None] = None) -> tuple[list[Path], Path]:
    """(the run directories `arg` names, newest first; the runs root names were looked up in)."""
    where = root(runs_root)
    found, _ = status_select.select([arg], where)
    return sorted(found, key=_mtime, reverse=True), where


def _mtime(run: Path) -> float:
    """When the run last changed: its ledger directory's (each attempt adds files), else its own."""
    for path in (RunDir(run).ledger_dir, run):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def not_found(arg: str, where: Path) -> str:
    return (
        f"RUN={arg!r}: no run directory there and no run of that name under {where}; pass "
        f"{HELP} (`slurmtrain status` lists them)"
    )


def one(arg: str, command: str, runs_root: Union[str, Path, None] = None) -> Optional[Path]:
    """The one run `arg` names (the newest when it names several, said on stderr); None, with
    the reason on stderr, when it names none. A directory that holds no config.yaml and no run
    is returned as given: the command says what it lacks (logs/, ledger.d/)."""
    found, where = resolve(arg, runs_root)
    if not found and Path(arg).expanduser().is_dir():
        return Path(arg).expanduser()
    if not found:
        print(f"slurmtrain {command}: {not_found(arg, where)}", file=sys.stderr)
        return None
    if len(found) > 1:
        others = ", ".join(p.name for p in found[1:4]) + (", ..." if len(found) > 4 else "")
        print(
            f"slurmtrain {command}: {arg!r} names {len(found)} runs; reading the newest, "
            f"{found[0]} (others: {others}; pass a run directory to read another)",
            file=sys.stderr,
        )
    return found[0]
