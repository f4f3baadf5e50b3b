"""Checkpoints that are never half-written and never silently corrupt.

Protocol (DESIGN.md): every rank writes its shards into `step_N.tmp/` through DeepSpeed; rank 0
fsyncs them, writes `manifest.json` (files, sizes, checksums, world size, step, consumed samples,
data position), renames the directory to `step_N/`, then atomically replaces `latest` (temp file +
rename; the same one-line format DeepSpeed's own `latest` uses). A directory without a manifest, or
whose files do not match it, is never loaded: `find_resumable` walks back to the newest valid one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_DIR = re.compile(r"^step_(\d+)$")


def tag(step: int) -> str:
    return f"step_{step}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def publish(root: Path, step: int, meta: dict[str, Any], verify: str) -> Path:
    """Rank 0, after every rank finished writing `step_N.tmp/`: manifest, rename, `latest`."""
    tmp, final = root / f"{tag(step)}.tmp", root / tag(step)
    files = {}
    for path in _files(tmp):
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        entry: dict[str, Any] = {"size": path.stat().st_size}
        if verify == "checksum":
            entry["sha256"] = _digest(path)
        files[str(path.relative_to(tmp))] = entry
    manifest = {"step": step, "time": time.time(), "verify": verify, "files": files, **meta}
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():  # a stale copy of this step (re-saved after a resume): replace it whole
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(tag(step))
    with open(pointer, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)
    return final


def validate(directory: Path, full: bool = True) -> Optional[str]:
    """None if the checkpoint matches its manifest; else the reason it must not be loaded."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (save did not finish)"
    except (OSError, json.JSONDecodeError) as err:
        return f"unreadable manifest: {err}"
    listed = manifest.get("files") or {}
    if not listed:
        return "manifest lists no files"
    for name, entry in listed.items():
        path = directory / name
        if not path.is_file():
            return f"missing file {name}"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name}: {size} bytes, manifest says {entry['size']}"
        if full and "sha256" in entry and _digest(path) != entry["sha256"]:
            return f"{name}: checksum mismatch (corrupt)"
    return None


def read_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / MANIFEST).read_text())


def step_dirs(root: Path) -> list[Path]:
    """Published checkpoints, newest first (`.tmp` directories are never candidates)."""
    found = [(int(m[1]), p) for p in root.glob("step_*") if (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


@dataclass
class Resume:
    path: Optional[Path] = None
    manifest: dict[str, Any] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)


def find_resumable(root: Path, full: bool = True) -> Resume:
    """The newest checkpoint that validates; every one skipped on the way is reported with why."""
    result = Resume()
    if not root.is_dir():
        return result
    for directory in step_dirs(root):
        reason = validate(directory, full)
        if reason is None:
            result.path, result.manifest = directory, read_manifest(directory)
            return result
        result.skipped.append((str(directory), reason))
    return result


def prune(root: Path, keep_last: int, keep_every: int = 0) -> list[Path]:
    """Keep the newest `keep_last` valid-looking checkpoints plus every `keep_every`-th step."""
    pointed = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    removed = []
    for i, directory in enumerate(step_dirs(root)):
        step = int(directory.name.split("_")[1])
        if i < keep_last or directory.name == pointed or (keep_every and step % keep_every == 0):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    for stale in root.glob("step_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in _files(directory))


class Checkpointer:
    """Collective save/load around a DeepSpeed engine; every rank calls every method."""

    def __init__(self, root: Path, rank: int, barrier: Callable[[], None], verify: str) -> None:
        self.root, self.rank, self.barrier, self.verify = root, rank, barrier, verify
        root.mkdir(parents=True, exist_ok=True)

    def save(self, engine: Any, step: int, meta: dict[str, Any], rng: dict[str, Any]) -> Path:
        import torch

        tmp = self.root / f"{tag(step)}.tmp"
        if self.rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        self.barrier()
        engine.save_checkpoint(str(self.root), tag=tmp.name, client_state={"meta": meta},
                               save_latest=False)
        torch.save(rng, tmp / f"rng_rank{self.rank}.pt")
        self.barrier()
        final = self.root / tag(step)
        if self.rank == 0:
            publish(self.root, step, meta, self.verify)
        self.barrier()
        return final

    def load(self, engine: Any, directory: Path) -> dict[str, Any]:
        import torch

        path, client = engine.load_checkpoint(str(directory.parent), tag=directory.name)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {directory}")
        rng_file = directory / f"rng_rank{self.rank}.pt"
        return torch.load(rng_file, weights_only=False) if rng_file.exists() else {}
