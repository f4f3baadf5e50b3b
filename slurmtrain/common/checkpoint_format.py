"""The on-disk checkpoint protocol: never half-written, never silently corrupt (no torch).

Every rank writes and fsyncs its shards into `step_N.tmp/`; rank 0 writes `manifest.json` (files,
sizes, checksums, step, world size...), renames the directory to `step_N/`, then replaces `latest`
atomically. A directory whose files do not match its manifest is never loaded: `find_resumable`
walks back to the newest valid one. In common/ because the login node reads it too (branching);
the collective save lives in compute/checkpoint/manager.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Callable,
    Collection,
    Final,
    Mapping,
    Optional,
    Sequence,
    TypedDict,
    Union,
    cast,
)

from slurmtrain.common import durable
from slurmtrain.common.checkpoint_pins import pinned_steps

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_DIR = re.compile(r"^step_(\d+)$")
MARKER = re.compile(r"^\.(done|failed)_rank(\d+)\.json$")
# A file one rank wrote and reads back: its ZeRO partition (zero_pp_rank_R_...) or RNG state
OWNER = re.compile(r"zero_pp_rank_(\d+)_|rng_rank(\d+)\.")
Progress = Callable[[int], None]  # bytes so far: a heartbeat for long reads


def tag(step: int) -> str:
    return f"step_{step}"


# zlib's CRC-32, over twice sha256's speed: it catches flipped bytes, zeroed pages and truncation
# (what disks and filesystems do), not a forged checkpoint. Manifests listing sha256 still verify.
CHECKSUM: Final = "crc32"


class FileEntry(TypedDict, total=False):
    """One file of a manifest: its size, and its checksum when the save was verified."""

    size: int
    crc32: str
    sha256: str  # manifests of older saves


class SavedPosition(TypedDict, total=False):
    """A manifest's `data_position`: compute/data.py's DataPosition plus the skipped samples."""

    consumed_samples: int
    epoch: int  # one source
    per_source: dict[str, int]  # a blend: samples drawn from each source
    epochs: dict[str, int]
    skipped_samples: int  # past diverged windows, after rollbacks


class Origin(TypedDict):
    """The save a universal conversion was made from (its step folder, step and time)."""

    path: str
    step: Optional[int]
    time: Optional[float]


class Manifest(TypedDict, total=False):
    """`manifest.json`: what `seal` writes, then the saver's own fields (trainer.py's meta, or
    reshape.py's for a universal conversion)."""

    time: float
    verify: str
    files: dict[str, FileEntry]
    step: int
    world_size: int
    consumed_samples: int
    zero_stage: int
    loss: float
    data_position: SavedPosition
    kind: str  # "universal" for a conversion
    source: Origin
    cores: int


class Crc32:
    """A hashlib-like running CRC-32 (zlib releases the GIL on large buffers)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Union[bytes, bytearray, memoryview]) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _digest(path: Path, kind: str = CHECKSUM, progress: Optional[Progress] = None) -> str:
    """The file's checksum; `progress(bytes read)` after each 16 MB (a heartbeat)."""
    with open(path, "rb") as f:
        crc, sha = Crc32(), hashlib.sha256()
        done = 0
        while chunk := f.read(16 << 20):
            (sha if kind == "sha256" else crc).update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done)
        return sha.hexdigest() if kind == "sha256" else crc.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST and not MARKER.match(p.name)
    )


def seal(
    tmp: Path,
    final: Path,
    fields: Mapping[str, object],
    verify: str,
    reports: Optional[Sequence[Mapping[str, object]]] = None,
) -> dict[str, object]:
    """Manifest into `tmp`, then rename it to `final` (a previous `final` is replaced whole).

    Files listed in `reports` were fsynced and hashed by the rank that wrote them; any other file
    (written outside our engine) is fsynced and hashed here.
    """
    listed: dict[str, FileEntry] = {}
    for report in reports or []:
        reported = report["files"]
        if not isinstance(reported, dict):
            raise TypeError(f"a writer's report lists its files as {type(reported).__name__}")
        listed.update(reported)
    files: dict[str, FileEntry] = {}
    for path in _files(tmp):
        name = str(path.relative_to(tmp))
        size = path.stat().st_size
        entry = listed.get(name)
        if entry is None:
            durable.fsync_path(path)
            entry = FileEntry(size=size)
            if verify == "checksum":
                entry[CHECKSUM] = _digest(path)
        elif entry["size"] != size:
            raise OSError(f"{name}: {size} bytes on disk, its writer reported {entry['size']}")
        files[name] = entry
    missing = sorted(set(listed) - set(files))
    if missing:
        raise OSError(f"files reported written but not found: {', '.join(missing[:5])}")
    for marker in tmp.glob(".*_rank*.json"):
        marker.unlink()
    manifest: dict[str, object] = {"time": time.time(), "verify": verify, "files": files, **fields}
    durable.write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1))
    old = final.with_name(final.name + ".old")
    if final.exists():  # a stale copy of this step (re-saved after a resume)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    durable.fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return manifest


def publish(
    root: Path,
    step: int,
    meta: Mapping[str, object],
    verify: str,
    reports: Optional[Sequence[Mapping[str, object]]] = None,
) -> Path:
    """Rank 0, after every rank finished writing `step_N.tmp/`: manifest, rename, `latest`.

    Everything that allocates disk space (manifest, pointer temp file) happens before the renames,
    so a full disk fails the save before anything visible changed.
    """
    tmp, final = root / f"{tag(step)}.tmp", root / tag(step)
    pointer = root / f".{LATEST}.tmp"
    durable.write_synced(pointer, tag(step))
    try:
        seal(tmp, final, {"step": step, **meta}, verify, reports)
    except BaseException:
        pointer.unlink(missing_ok=True)
        raise
    os.replace(pointer, root / LATEST)
    durable.fsync_path(root)
    return final


def validate(directory: Path, full: bool = True, files: bool = True) -> Optional[str]:
    """None if the checkpoint matches its manifest; else the reason it must not be loaded.
    `files=False`: the manifest only (the ranks check the files, each its share, in parallel)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (save did not finish)"
    except (OSError, json.JSONDecodeError) as err:
        return f"unreadable manifest: {err}"
    listed = manifest.get("files") or {}
    if not listed:
        return "manifest lists no files"
    for name, entry in listed.items() if files else ():
        reason = _check_file(directory, name, entry, full)
        if reason is not None:
            return reason
    return None


def _check_file(
    directory: Path,
    name: str,
    entry: FileEntry,
    full: bool,
    progress: Optional[Progress] = None,
) -> Optional[str]:
    path = directory / name
    if not path.is_file():
        return f"missing file {name}"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"{name}: {size} bytes, manifest says {entry['size']}"
    kind, expected = (
        (CHECKSUM, entry.get(CHECKSUM)) if CHECKSUM in entry else ("sha256", entry.get("sha256"))
    )
    if full and expected is not None and _digest(path, kind, progress) != expected:
        return f"{name}: checksum mismatch (corrupt)"
    return None


def files_for_rank(files: Mapping[str, FileEntry], rank: int, world: int) -> list[str]:
    """The manifest's files rank `rank` of `world` checksums: the ones it wrote (its ZeRO
    partition, its RNG state) and a share of the rest (shared files, and those of ranks that are
    no longer there), balanced by size. Every rank computes the same split; together they cover
    every file once."""
    load = [0] * world
    owner: dict[str, int] = {}
    rest = []
    for name, entry in files.items():
        m = OWNER.search(name)
        r = int(m[1] or m[2]) if m else -1
        if 0 <= r < world:
            owner[name] = r
            load[r] += int(entry.get("size", 0))
        else:
            rest.append(name)
    for name in sorted(rest, key=lambda n: (-int(files[n].get("size", 0)), n)):
        r = min(range(world), key=lambda i: (load[i], i))
        owner[name] = r
        load[r] += int(files[name].get("size", 0))
    return sorted(n for n, r in owner.items() if r == rank)


def read_bytes(files: Mapping[str, FileEntry], rank: int, world: int) -> int:
    """What rank `rank` reads of a checkpoint when loading it: its own partition and RNG state
    and every shared file (a universal checkpoint's are all shared)."""
    total = 0
    for name, entry in files.items():
        m = OWNER.search(name)
        if m is None or int(m[1] or m[2]) == rank:
            total += int(entry.get("size", 0))
    return total


def verify_files(
    directory: Path,
    names: list[str],
    progress: Optional[Progress] = None,
    listed: Optional[Mapping[str, FileEntry]] = None,
) -> Optional[str]:
    """Checksum `names` (a rank's share, `files_for_rank`) against the manifest; None if they
    match, else the first reason. `progress(bytes so far)` beats during the reads. `listed`: the
    manifest's files as rank 0 read and broadcast them (else read here)."""
    try:
        listed = (read_manifest(directory).get("files") or {}) if listed is None else listed
    except (OSError, json.JSONDecodeError) as err:
        return f"unreadable manifest: {err}"
    done = 0

    def beat(n: int) -> None:
        if progress is not None:
            progress(done + n)

    for name in names:
        if name not in listed:
            return f"{name}: not in the manifest"
        try:
            reason = _check_file(directory, name, listed[name], True, beat)
        except OSError as err:
            return f"{name}: {type(err).__name__}: {err}"
        if reason is not None:
            return reason
        done += int(listed[name]["size"])
    return None


def read_manifest(directory: Path) -> Manifest:
    """files (`FileEntry` each), verify, time, and the saver's own fields (step, world size...)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    if not isinstance(manifest, dict):
        raise ValueError(f"{directory / MANIFEST} holds a JSON {type(manifest).__name__}")
    return cast(Manifest, manifest)  # the object `seal` wrote


def step_dirs(root: Path) -> list[Path]:
    """Published checkpoints, newest first (`.tmp` directories are never candidates)."""
    found = [(int(m[1]), p) for p in root.glob("step_*") if (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


@dataclass
class Resume:
    path: Optional[Path] = None
    manifest: Manifest = field(default_factory=Manifest)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)


Check = Callable[[Path], Optional[str]]  # a further check of a candidate (the ranks' checksums)


def find_resumable(
    root: Path, full: bool = True, check: Optional[Check] = None, check_files: bool = False
) -> Resume:
    """The newest checkpoint that validates; every one skipped on the way is reported with why.
    With `check`, a candidate whose manifest and sizes match is passed to it (the ranks checksum
    their own files in parallel) instead of being checksummed here. `check_files`: `check` also
    checks every file's presence and size (each rank its share), so this reads the manifest
    only, not one stat per file of every rank (a restart's cost flat in node count)."""
    result = Resume()
    if not root.is_dir():
        return result
    for directory in step_dirs(root):
        reason = validate(directory, full and check is None, files=not check_files)
        if reason is None and check is not None:
            reason = check(directory)
        if reason is None:
            result.path, result.manifest = directory, read_manifest(directory)
            return result
        result.skipped.append((str(directory), reason))
    return result


def prune(
    root: Path, keep_last: int, keep_every: int = 0, protect: Collection[int] = ()
) -> list[Path]:
    """Keep the newest `keep_last` checkpoints that validate, the first one at or past each
    multiple of `keep_every` (saves by time land on any step), and the steps in `protect`
    (rollback targets); drop leftovers.

    Only checkpoints that validate (manifest, files, sizes: no checksums, this runs after every
    save) count towards `keep_last`, and the newest valid one is never removed: a damaged newer
    directory can never push the last good one out. A damaged one is kept while it is newer than
    the kept window (for a person to look at), removed once it is older.
    Only called while no save is in flight (rank 0, right after a publish), so every `.tmp`
    directory is an abandoned one.
    """
    pointed = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    pinned = pinned_steps(root)  # branches of this run start from these (common/checkpoint_pins.py)
    removed, kept, valid = [], set(), 0
    found = [
        (d, int(d.name.split("_")[1]), validate(d, full=False) is None) for d in step_dirs(root)
    ]
    firsts: dict[int, int] = {}  # keep_every span -> its oldest valid step
    for _, step, ok in found:
        if keep_every and step >= keep_every and ok:
            span = step // keep_every
            firsts[span] = min(firsts.get(span, step), step)
    for directory, step, ok in found:
        window = valid < max(keep_last, 1)
        valid += ok
        if (
            window
            or directory.name == pointed
            or step in firsts.values()
            or step in protect
            or step in pinned
        ):
            kept.add(directory.name)
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    for stale in [*root.glob("step_*.tmp"), *root.glob("step_*.old")]:
        shutil.rmtree(stale, ignore_errors=True)
    for marker in root.glob(".step_*.tmp.failed_rank*"):
        marker.unlink(missing_ok=True)
    for universal in root.glob("step_*_universal"):  # conversions of checkpoints now gone
        if universal.name.removesuffix("_universal") not in kept:
            shutil.rmtree(universal, ignore_errors=True)
    return removed


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in _files(directory))
