"""Pins: a parent run's checkpoint that a branch (login/branch.py) starts from is kept by its prune.

A branch loads the parent's `step_N/` in place (nothing big is copied), so the parent resuming and
pruning past keep_last must not remove it. The branch's submission writes an empty marker
`<parent>/checkpoints/pins/step_N.<child dir name>`; prune (format.prune) keeps every pinned step.
The branch's first attempt that resumes from a checkpoint of its own removes it (select.release).
The marker lives beside the step directories, never inside one: the checkpoint's files (and their
checksums) are untouched. No torch here: the login node writes pins, rank 0 reads them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from slurmtrain.common import durable

PINS = "pins"
_PIN = re.compile(r"step_(\d+)\.(.+)")


def pin(root: Path, step: int, by: str) -> Path:
    """Pin `root`'s step `step` for the run directory named `by` (idempotent, durable)."""
    folder = root / PINS
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"step_{step}.{by}"
    if not marker.exists():  # the entry itself must survive a crash: it is what keeps the step
        durable.create_empty(marker)
    return marker


def pinned_steps(root: Path) -> dict[int, list[str]]:
    """Step -> the run directories that pinned it (one listing: O(1) per prune)."""
    try:
        names = os.listdir(root / PINS)
    except OSError:
        return {}
    found: dict[int, list[str]] = {}
    for name in names:
        if m := _PIN.fullmatch(name):
            found.setdefault(int(m[1]), []).append(m[2])
    return found


def unpin(root: Path, step: int, by: str) -> None:
    """The branch `by` has a checkpoint of its own: the parent's prune may drop `step` again."""
    try:
        os.unlink(root / PINS / f"step_{step}.{by}")
    except FileNotFoundError:
        pass
