"""Resuming on another world size: DeepSpeed's universal checkpoint, converted once and cached.

A ZeRO checkpoint is sharded by data-parallel rank, so W ranks' files do not load on W' ranks.
`deepspeed.checkpoint.ds_to_universal` rewrites it per parameter, which loads on any world size with
`"checkpoint": {"load_universal": true}`. Rank 0 runs the conversion as a subprocess on every core
of the node into `step_N_universal.tmp/`, sealed with our manifest like any checkpoint, so a
converted folder is reused only when it is complete and was made from the same save of step N.

While it runs, every rank beats its watchdog each time the output folder has grown (`growing`): a
long conversion is progress, a stalled one a hang. Only rank 0 walks the folder and writes a small
note beside it ("<seq> <bytes>"); the lowest rank of each host copies the note into the host's
/dev/shm, which the host's other ranks read: O(hosts) shared-filesystem calls per poll, not
O(ranks x entries). If rank 0 or a host's reader dies, the beats behind it stop and the watchdogs
fire, as they should.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Union

from slurmtrain.common import checkpoint_format, events
from slurmtrain.compute.distributed import host_leads

SUFFIX = "_universal"


class ReshapeError(RuntimeError):
    pass


@dataclass
class Converted:
    path: Path
    seconds: float
    cached: bool


def universal_dir(step_dir: Path) -> Path:
    return step_dir.with_name(step_dir.name + SUFFIX)


def _tmp(out: Path) -> Path:
    return out.with_name(out.name + ".tmp")


def cached(step_dir: Path, source: Mapping[str, object], full: bool = False) -> Optional[Path]:
    """The converted folder if it is complete and made from this very save of the step."""
    out = universal_dir(step_dir)
    if not out.is_dir() or checkpoint_format.validate(out, full) is not None:
        return None
    made_from = checkpoint_format.read_manifest(out).get("source", {})
    if made_from.get("time") != source.get("time") or made_from.get("step") != source.get("step"):
        return None
    return out


@contextlib.contextmanager
def node_cores() -> Iterator[int]:
    """This thread's CPU affinity widened to every core of the node for the block (the converter's
    subprocess inherits it), then restored; yields how many cores it got. srun binds a task to its
    1-2 cores (`--cpu-bind=cores`), while the node's other ranks sit idle in a broadcast waiting for
    the conversion; the kernel keeps the result within the job's cgroup (its allocated cores)."""
    if not hasattr(os, "sched_setaffinity"):  # not Linux
        yield os.cpu_count() or 1
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass  # refused: the task's own cores
    try:
        yield len(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, before)


def convert(
    step_dir: Path,
    source: Mapping[str, object],
    verify: str = "size",
    timeout_s: Optional[float] = None,
) -> Converted:
    """`step_N/` -> `step_N_universal/` (or the cached one); raises ReshapeError with the cause."""
    hit = cached(step_dir, source, full=verify == "checksum")
    if hit is not None:
        return Converted(hit, 0.0, True)
    out = universal_dir(step_dir)
    tmp = _tmp(out)
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.time()
    with node_cores() as cores:
        proc = _run(step_dir, tmp, cores, timeout_s)
    # It points `latest_universal` at the folder it wrote (our .tmp name); we pass tags ourselves.
    (step_dir.parent / "latest_universal").unlink(missing_ok=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise ReshapeError(f"ds_to_universal on {step_dir} failed (exit {proc.returncode}): {tail}")
    fields = {
        "kind": "universal",
        "step": source.get("step"),
        "world_size": source.get("world_size"),
        "source": {"path": step_dir.name, "step": source.get("step"), "time": source.get("time")},
        "cores": cores,
    }
    checkpoint_format.seal(tmp, out, fields, verify)
    return Converted(out, time.time() - started, False)


def _run(
    step_dir: Path, tmp: Path, cores: int, timeout_s: Optional[float]
) -> subprocess.CompletedProcess[str]:
    """ds_to_universal in a subprocess, one extract and one merge worker per core."""
    workers = str(max(1, cores))
    cmd = [
        sys.executable,
        "-m",
        "slurmtrain.compute.checkpoint.safe_load",  # weights-only loads (safe_load.py)
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(step_dir),
        "--output_folder",
        str(tmp),
        "--num_extract_workers",
        workers,
        "--num_merge_workers",
        workers,
        # ZeRO-1/2 checkpoints lack the universal-info key the converter insists on
        "--inject_missing_state",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    # Slurm signals every process of the step (the time-limit USR2, a preemption's TERM): the
    # converter ignores them (its own session, the signals blocked from fork to SIG_IGN, so none
    # slips in between) and finishes, while the rank's handler decides what to do after it.
    shielded = [sys.executable, "-c", _SHIELD, *cmd[3:]]
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED)  # pending here, never lost
    try:
        proc = subprocess.Popen(
            shielded,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException as stopped:
        # Timed out, or this rank is going down: no half-written conversion outlives it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(stopped, subprocess.TimeoutExpired):
            raise ReshapeError(f"ds_to_universal on {step_dir} took over {timeout_s} s") from None
        raise
    return subprocess.CompletedProcess(shielded, proc.returncode, out, err)


_SHIELDED = {signal.SIGUSR2, signal.SIGTERM, signal.SIGINT}
# The converter's entry: ignore the rank's stop signals (its pool workers inherit SIG_IGN), die
# with the rank that started it (PR_SET_PDEATHSIG), then run DeepSpeed's module as `python -m`.
_SHIELD = """
import ctypes, signal, sys
for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2, signal.SIGTERM, signal.SIGINT})
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
from slurmtrain.compute.checkpoint import safe_load  # weights-only loads in the converter too
safe_load.main(sys.argv[1:])  # argv: the converter's module, then its arguments
"""


WALK, RELAY, FOLLOW = "walk", "relay", "follow"  # rank 0, one rank per other host, the rest


def shared_note(folder: Path) -> Path:
    """Rank 0's note of the folder's growth, beside it on the shared filesystem."""
    return folder.with_name(f".{folder.name}.progress")


def local_note(folder: Path) -> Path:
    """The host's copy of the note, in memory (/dev/shm): reading it costs no shared-FS call."""
    shm = Path("/dev/shm")
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    key = hashlib.sha1(str(folder.absolute()).encode()).hexdigest()[:16]
    return where / f"slurmtrain-convert-{key}.progress"


def _put(note: Path, text: str) -> None:
    """Overwritten in place, always the same length: a reader sees the old note, the new one or a
    mix of both (a beat, and only while the folder is growing), never an empty file; no rename,
    so an NFS client's cached lookup of the name never hides a new note. A note that cannot be
    written is a missed beat."""
    try:
        fd = os.open(note, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)
    except OSError:
        pass


def _bytes(note: str) -> int:
    tail = note.split()[-1] if note.split() else ""
    return int(tail) if tail.isdigit() else 0


def _get(note: Path) -> Optional[str]:
    try:
        return note.read_text()
    except OSError:
        return None


@contextlib.contextmanager
def growing(
    folder: Path,
    beat: Callable[[int], None],
    every_s: float = 10.0,
    role: str = WALK,
    note: Optional[Path] = None,
) -> Iterator[None]:
    """`beat(bytes)` whenever `folder` holds other bytes than at the last look: the converter
    writes file after file (and deletes its extraction fragments before merging), so a conversion
    longer than its planned deadline is progress, not a hang; a folder that stays the same is.
    `role`: WALK (rank 0) walks the folder and writes the notes; RELAY (the lowest rank of each
    other host) reads the shared note into its host's note; FOLLOW reads its host's note.
    `note`: the host's note (default `local_note`; tests give each simulated host its own)."""
    stop = threading.Event()
    shared, local = shared_note(folder), note or local_note(folder)
    source = {WALK: None, RELAY: shared, FOLLOW: local}[role]

    def watch() -> None:
        seq, seen_size, seen_text = 0, 0, None  # WALK: the folder's bytes; the others: the note
        while not stop.wait(every_s):
            if role == WALK:
                try:
                    size = checkpoint_format.dir_bytes(folder)
                except OSError:  # a file renamed or removed between the listing and its stat
                    continue
                if size == seen_size:
                    continue
                seen_size, seq = size, seq + 1
                note = f"{seq:020d} {size:020d}\n"
                _put(shared, note)
            else:
                text = _get(source) if source is not None else None
                if not text or text == seen_text:
                    continue
                note = seen_text = text
            if role != FOLLOW:
                _put(local, note)
            beat(_bytes(note))

    thread = threading.Thread(target=watch, name="convert-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for mine in {WALK: (shared, local), RELAY: (local,), FOLLOW: ()}[role]:
            mine.unlink(missing_ok=True)


def _int(value: object) -> Optional[int]:
    """A manifest's number (JSON: an int), None when absent."""
    return int(value) if isinstance(value, (int, float, str)) else None


def for_world(
    resume: checkpoint_format.Resume,
    rank: int,
    world: int,
    record: Callable[[events.Row], object],
    verify: str = "size",
    beat: Optional[Callable[[int], None]] = None,
) -> Path:
    """Collective: rank 0 converts (or reuses) the universal folder, everyone gets its path.
    `beat`: the watchdog's heartbeat for the conversion phase (see `growing`)."""
    import torch.distributed as dist

    assert resume.path is not None
    result: list[Union[None, str, tuple[str, float, bool]]] = [None]  # rank 0's outcome
    tmp = _tmp(universal_dir(resume.path))
    leads = host_leads()  # collective: every rank calls it
    role = WALK if rank == 0 else RELAY if leads[rank] == rank else FOLLOW
    with growing(tmp, beat, role=role) if beat is not None else contextlib.nullcontext():
        if rank == 0:
            try:
                done = convert(resume.path, resume.manifest, verify)
                result[0] = (str(done.path), done.seconds, done.cached)
            except (ReshapeError, OSError) as err:
                result[0] = f"{type(err).__name__}: {err}"
        dist.broadcast_object_list(result, src=0)
    outcome = result[0]
    if not isinstance(outcome, tuple):  # rank 0's error
        raise ReshapeError(
            f"cannot resume {resume.path} (world size "
            f"{resume.manifest.get('world_size')}) on {world} ranks: {outcome}"
        )
    path, seconds, was_cached = outcome
    record(
        events.CheckpointConverted(
            step=_int(resume.manifest.get("step")),
            path=path,
            seconds=seconds,
            cached=was_cached,
            from_world_size=_int(resume.manifest.get("world_size")),
            to_world_size=world,
        )
    )
    if rank == 0:
        how = "reused" if was_cached else f"converted in {seconds:.1f} s"
        print(
            f"slurmtrain: resuming {resume.path.name} (written by "
            f"{resume.manifest.get('world_size')} ranks) on {world} ranks through its universal "
            f"checkpoint ({how}): {path}",
            file=sys.stderr,
            flush=True,
        )
    return Path(path)
