"""Which checkpoint an attempt starts from, and when it must refuse to start at all.

`resume=auto`: the newest checkpoint that validates; when the ledger shows published checkpoints
and none validates now, the attempt stops (`checkpoint_unreadable`, naming each and why) instead
of training from step 0. `resume=none` and `resume=step_N` apply once, to the first attempt after
the submission that asked: newer checkpoints move to `checkpoints/discarded/<time>/` (nothing is
deleted). A checkpoint that validated but failed to load carries an `unloadable.json` marker, and
is skipped from then on. Rank 0 only, pure file operations; with checksums `check` is the ranks'
collective checksum (checkpoint/verify.py).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from slurmtrain.common import checkpoint_pins, events, ledger
from slurmtrain.common.checkpoint_format import (
    LATEST,
    Check,
    Resume,
    SavedPosition,
    find_resumable,
    read_manifest,
    step_dirs,
    tag,
    validate,
)
from slurmtrain.common.durable import write_synced
from slurmtrain.common.events import Rows

DISCARDED = "discarded"

UNLOADABLE = "unloadable.json"  # inside step_N/: moved or pruned with it


def mark_unloadable(directory: Path, error: str, **who: object) -> None:
    """Rank 0: `directory` validated but did not load; no attempt is to try it again."""
    note = {"step": int(directory.name.split("_")[1]), "error": error, "time": time.time(), **who}
    part = directory / f".{UNLOADABLE}.tmp"
    write_synced(part, json.dumps(note))
    os.replace(part, directory / UNLOADABLE)


def unloadable(directory: Path) -> Optional[str]:
    """Why `directory` is not to be loaded again (its marker), or None."""
    try:
        note = json.loads((directory / UNLOADABLE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f"failed to load before (marker unreadable: {err})"
    return f"failed to load before (attempt {note.get('attempt')}): {note.get('error')}"


def loadable(check: Optional[Check], full: bool) -> Check:
    """`check` (or, without one, the full checksum when `full`), after the marker test."""

    def checked(directory: Path) -> Optional[str]:
        why = unloadable(directory)
        if why is not None:
            return why
        if check is not None:
            return check(directory)
        return validate(directory, True) if full else None

    return checked


@dataclass
class Choice:
    found: Resume
    stop: Optional[str] = None  # checkpoint_unreadable: the error line (each checkpoint and why)
    # resume=none|step_N applied: the row to record (the step folders moved to discarded/<time>/)
    applied: Optional[events.ResumeApplied] = None


def choose(
    root: Path,
    rows: Rows,
    resume: str,
    full: bool,
    check: Optional[Check] = None,
    branch: Optional[tuple[str, int]] = None,
) -> Choice:
    """`check`: the collective checksum of a candidate (find_resumable), else `full`.
    `branch`: (resume_from, data.skip_samples) of a branched run: its start when it has no
    checkpoint of its own yet (`branch_point`)."""
    mode = ledger.resume_request(rows, resume)
    if mode == "none":
        moved = discard(root, keep_upto=None)
        applied = events.ResumeApplied(resume=mode, moved=tuple(moved))
        if branch is not None:  # a branch's step 0 is its branch point
            return replace(branch_point(*branch, full, check), applied=applied)
        return Choice(Resume(), applied=applied)
    if mode.startswith("step_"):
        step = int(mode.removeprefix("step_"))
        directory = root / tag(step)
        if not directory.is_dir():
            reason: Optional[str] = "no such checkpoint"
        else:
            reason = validate(directory, full and check is None, files=check is None)
            if reason is None and check is not None:
                reason = check(directory)  # every rank checksums its own files
        if reason is not None:
            return Choice(Resume(), stop=f"resume={mode}: {directory}: {reason}")
        moved = discard(root, keep_upto=step)
        found = Resume(directory, read_manifest(directory))
        applied = events.ResumeApplied(resume=mode, moved=tuple(moved), kept_step=step)
        return Choice(found, applied=applied)
    found = find_resumable(root, full, loadable(check, full), check_files=check is not None)
    published = ledger.published_since_reset(rows)
    if found.path is None and not published and branch is not None:
        return branch_point(*branch, full, check)  # the branch's own checkpoints come first
    if found.path is not None and branch is not None:
        release(branch[0], root.parent.name)
    if found.path is not None or not published:
        return Choice(found)
    named = "; ".join(f"{Path(p).name}: {why}" for p, why in found.skipped)
    if not named:
        newest = max(e.step or 0 for e in published)
        named = f"none of them is in {root} (newest published: {tag(newest)})"
    return Choice(
        found,
        stop=f"{len(published)} checkpoint(s) published and none validates now: {named}. "
        f"Fix the storage, or pass resume=none to start from step 0 "
        f"(or resume=step_N for another checkpoint)",
    )


def discard(root: Path, keep_upto: Optional[int]) -> list[str]:
    """Move the checkpoints newer than `keep_upto` (all when None) to discarded/<time>/."""
    if not root.is_dir():
        return []
    doomed = [
        d for d in step_dirs(root) if keep_upto is None or int(d.name.split("_")[1]) > keep_upto
    ]
    if not doomed:
        return []
    target = root / DISCARDED / time.strftime("%Y%m%d-%H%M%S")
    target.mkdir(parents=True, exist_ok=True)
    for d in doomed:
        os.rename(d, target / d.name)
        universal = root / f"{d.name}_universal"
        if universal.is_dir():
            os.rename(universal, target / universal.name)
    latest = root / LATEST
    if keep_upto is None:
        latest.unlink(missing_ok=True)
    else:
        part = root / f".{LATEST}.tmp"
        part.write_text(tag(keep_upto))
        os.replace(part, latest)
    return [d.name for d in doomed]


def branch_point(
    resume_from: str, skip_samples: int, full: bool, check: Optional[Check] = None
) -> Choice:
    """A branch's start: the parent's checkpoint `PARENT_DIR:step_N` (as login/branch.py wrote
    it), read in place and never written; its data position moved `skip_samples` further on (the
    branch's own checkpoints record it, so it applies once). A checkpoint that no longer
    validates stops the run (`checkpoint_unreadable`) rather than training from step 0."""
    parent, _, step = resume_from.rpartition(":")
    directory = Path(parent) / "checkpoints" / step
    reason: Optional[str] = "no such checkpoint" if not directory.is_dir() else None
    if reason is None:
        reason = validate(directory, full and check is None)
    if reason is None and check is not None:
        reason = check(directory)  # every rank checksums its own files
    if reason is not None:
        return Choice(
            Resume(),
            stop=f"resume_from={resume_from}: {directory}: {reason}; branch from "
            f"another step (resume_from={parent}:step_N)",
        )
    manifest = read_manifest(directory)
    position = (manifest.get("data_position") or SavedPosition()).copy()
    position["skipped_samples"] = int(position.get("skipped_samples", 0)) + int(skip_samples)
    manifest["data_position"] = position
    return Choice(Resume(directory, manifest))


def release(resume_from: str, child: str) -> None:
    """A branch that resumes from its own checkpoint no longer needs its parent's step: the pin
    goes (a branch's `resume=none` then needs that step to still be there; it says so if not)."""
    parent, _, step = resume_from.rpartition(":")
    try:
        checkpoint_pins.unpin(Path(parent) / "checkpoints", int(step.removeprefix("step_")), child)
    except (OSError, ValueError):
        pass  # the parent's directory is read-only or gone: the pin costs it one kept step
