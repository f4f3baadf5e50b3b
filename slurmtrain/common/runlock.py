"""The run's exclusive lock: flock(2) where the filesystem makes it coherent, else a lease file.

flock excludes across nodes only where the client forwards it (Lustre `flock`, NFSv4, NFSv3 with
lockd); `localflock`/`local_lock` mounts grant every node its own lock, so `choose` reads the
mount options from /proc/self/mountinfo, and a flock that raises ENOLCK/EOPNOTSUPP/ENOSYS falls
back at run time. The lease (`.owner.lease`, O_EXCL) names its holder and a random token; a thread
renews its mtime every BEAT_S. It is stale when its holder is a dead pid on this host or its mtime
stood still for STALE_S on the contender's own clock; take-over renames it aside first, so only
one contender wins. Under a coherent flock the lease is taken too: compute nodes may mount the
same filesystem with localflock and see only the lease.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Optional, TypedDict

from slurmtrain.common import ownership

FLOCK, LEASE = "flock", "lease"
BEAT_S, STALE_S = 5.0, 60.0
SQUAT_S = 2.0  # an old lock busy this long with no lease: a reader squats it (_flocked)
LEASE_NAME = ".owner.lease"
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
MOUNTINFO = Path("/proc/self/mountinfo")
_fallen_back: set[str] = set()  # directories whose flock raised one of NO_FLOCK this process


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    options: frozenset[str]  # per-mount and superblock options together


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> list[Mount]:
    """proc(5) mountinfo lines: `id parent maj:min root point opts [optional...] - type source
    superopts`."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3:
            continue
        opts = fields[5].split(",") + (
            fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        )
        mounts.append(Mount(_unescape(fields[4]), fields[dash + 1], frozenset(opts)))
    return mounts


def mount_of(path: Path, mounts: list[Mount]) -> Optional[Mount]:
    """The mount holding `path` (longest mount point that is a prefix; the last one mounted wins)."""
    target, best = str(path), None
    for m in mounts:
        inside = target == m.point or target.startswith(m.point.rstrip("/") + "/")
        if inside and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def lock_for(mount: Optional[Mount]) -> tuple[str, str]:
    """(flock | lease, why) for a directory on `mount`."""
    if mount is None:
        return FLOCK, "mount unknown: flock, with a lease if it raises"
    fs, opts = mount.fstype, mount.options
    if fs == "lustre":
        if "flock" in opts:
            return FLOCK, "lustre mounted with flock: coherent across nodes"
        why = (
            "localflock: flock excludes within one node only"
            if "localflock" in opts
            else ("noflock (lustre's default): flock raises ENOSYS")
        )
        return LEASE, f"lustre {why}"
    if fs.startswith("nfs"):
        local = next((o.split("=", 1)[1] for o in opts if o.startswith("local_lock=")), "none")
        if local in ("all", "flock"):
            return LEASE, f"{fs} local_lock={local}: flock excludes within one node only"
        if "nolock" in opts:
            return LEASE, f"{fs} nolock: locks stay on each client"
        return FLOCK, f"{fs}: flock goes to the server"
    return FLOCK, f"{fs}: flock"


def choose(directory: Path) -> tuple[str, str]:
    """The lock `directory` gets, and why (doctor prints both)."""
    if str(directory) in _fallen_back:
        return LEASE, "flock raised ENOLCK/EOPNOTSUPP/ENOSYS here"
    try:
        mounts = parse_mountinfo(MOUNTINFO.read_text())
    except OSError:
        return lock_for(None)
    return lock_for(mount_of(directory.resolve(), mounts))


@contextlib.contextmanager
def hold(
    directory: Path,
    timeout: float,
    busy: Callable[[str], Exception],
    flock_name: str = ".owner.lock",
    mode: Optional[int] = None,
) -> Iterator[str]:
    """Hold `directory`'s exclusive lock; yields which kind. Raises busy(who) after `timeout` s.
    `mode`: the run directory's (lock and lease are ownership.lock_mode of it; None: 0600)."""
    started = time.monotonic()
    if choose(directory)[0] == FLOCK:
        try:
            f = _flocked(directory / flock_name, timeout, busy, mode)
        except OSError as err:
            if err.errno not in NO_FLOCK:
                raise
            _fallen_back.add(str(directory))  # e.g. lustre noflock: the lease from now on
        else:
            # The lease too: a node whose mount lacks coherent flock (compute nodes mounted with
            # localflock beside a login node with flock) can only see that.
            try:
                left = max(1.0, timeout - (time.monotonic() - started))
                lease = Lease(directory / LEASE_NAME, under_flock=True, mode=mode)
                with lease.held(left, busy):
                    yield FLOCK
            finally:
                with f:
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            return
    with Lease(directory / LEASE_NAME, mode=mode).held(timeout, busy):
        yield LEASE


def _flocked(
    path: Path, timeout: float, busy: Callable[[str], Exception], mode: Optional[int] = None
) -> IO[bytes]:
    """The open lock file, flocked; OSError (not BlockingIOError) when flock is not supported.
    Opened for writing, never through a link, and never readable by who cannot write the run
    (ownership.open_lock): a read-only user cannot hold it. One such user may still hold an old
    lock file others could read (an older slurmtrain made it 0644): busy for SQUAT_S with no
    lease beside it (every slurmtrain holder takes one at once), it is replaced by a new one."""
    loose = _readable_by_others(path, mode)  # before open_lock repairs its mode
    f: IO[bytes] = os.fdopen(ownership.open_lock(path, mode), "r+b", buffering=0)
    try:
        deadline = time.monotonic() + timeout
        squat_since: Optional[float] = None
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return f
            except BlockingIOError:
                now = time.monotonic()
                if loose and not (path.parent / LEASE_NAME).exists():
                    squat_since = now if squat_since is None else squat_since
                    if now - squat_since >= SQUAT_S:
                        f.close()
                        f, loose = _replaced(path, mode), False
                        continue
                else:
                    squat_since = None
                if now >= deadline:
                    raise busy(f"another slurmtrain process holds {path}") from None
                time.sleep(0.2)
    except BaseException:
        f.close()
        raise


def _readable_by_others(path: Path, mode: Optional[int]) -> bool:
    """The lock file lets someone who cannot write the run open it (a mode made by old versions)."""
    try:
        bits = os.lstat(path).st_mode & 0o044
    except FileNotFoundError:
        return False
    return bool(bits & ~(ownership.lock_mode(mode) & 0o040))


def _replaced(path: Path, mode: Optional[int]) -> IO[bytes]:
    """A new lock file renamed over `path` (whoever holds the old one holds nothing), opened."""
    new = path.with_name(f"{path.name}.{secrets.token_hex(4)}.new")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(new, flags, ownership.lock_mode(mode))
    os.replace(new, path)
    return os.fdopen(fd, "r+b", buffering=0)


class LeaseOwner(TypedDict):
    """What a lease file says about its holder."""

    host: str
    pid: int
    job: Optional[str]
    token: str
    time: float
    flock: bool


class Lease:
    """An O_EXCL lease file renewed by a heartbeat thread (module docstring)."""

    def __init__(
        self,
        path: Path,
        beat_s: float = BEAT_S,
        stale_s: float = STALE_S,
        under_flock: bool = False,
        mode: Optional[int] = None,
    ) -> None:
        self.path, self.beat_s, self.stale_s = path, beat_s, stale_s
        self.mode = ownership.lock_mode(mode)  # only who may write the run may hold it
        # Taken while holding a coherent flock: a lease left by another flock holder is stale
        # at once (that holder would still hold the flock if it lived).
        self.under_flock = under_flock
        self.token = secrets.token_hex(8)
        self.lost = False  # set by the heartbeat when another process took the lease
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def owner(self) -> LeaseOwner:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job": os.environ.get("SLURM_JOB_ID"),
            "token": self.token,
            "time": time.time(),
            "flock": self.under_flock,
        }

    def _read(self, path: Optional[Path] = None) -> Optional[dict[str, object]]:
        """The lease's holder as written (`LeaseOwner`), {} for an empty file, None if unreadable."""
        try:
            holder = json.loads((path or self.path).read_text() or "{}")
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def try_acquire(self) -> bool:
        """Not fsynced: the O_EXCL entry and its text are seen by every process (and NFS client,
        on close) at once; only a crash could lose them, and it kills the holder too (a lease
        that outlived it would just be waited out). A sweep takes 64 of these (~3 ms a fsync)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, self.mode)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.owner()))
        return True

    def _dead_here(self, holder: Mapping[str, object]) -> bool:
        if holder.get("host") != socket.gethostname() or not holder.get("pid"):
            return False
        try:
            os.kill(int(str(holder["pid"])), 0)
        except ProcessLookupError:
            return True
        except (OSError, ValueError):
            return False
        return False

    def _take_over(self, holder: Mapping[str, object]) -> bool:
        """Rename the stale lease aside (one contender wins), then create ours."""
        aside = self.path.with_name(f"{self.path.name}.stale.{self.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return self.try_acquire()
        moved = self._read(aside) or {}
        if moved.get("token") != holder.get("token"):  # a live lease renewed under us: put it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        return self.try_acquire()

    def acquire(self, timeout: float, busy: Callable[[str], Exception]) -> None:
        deadline = time.monotonic() + timeout
        seen: Optional[tuple[object, float]] = None  # (token, mtime) and since when
        since = time.monotonic()
        while not self.try_acquire():
            holder = self._read() or {}
            try:
                mtime = self.path.stat().st_mtime
            except FileNotFoundError:
                continue
            now = time.monotonic()
            if seen != (holder.get("token"), mtime):
                seen, since = (holder.get("token"), mtime), now
            # An empty holder: its creator died before writing; the mtime bound still applies.
            gone = bool(holder) and (
                self._dead_here(holder) or (self.under_flock and bool(holder.get("flock")))
            )
            if gone or now - since >= self.stale_s:
                if self._take_over(holder):
                    break
                continue
            if now >= deadline:
                who = ", ".join(f"{k} {holder.get(k)}" for k in ("host", "pid", "job"))
                raise busy(
                    f"another slurmtrain process holds the lease {self.path} ({who}); it is "
                    f"taken over once its heartbeat stops for {self.stale_s:g} s"
                )
            time.sleep(min(0.5, self.beat_s))
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="run-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            holder = self._read()
            if holder is not None and holder.get("token") != self.token:
                self.lost = True
                return
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.lost and (self._read() or {}).get("token") == self.token:
            self.path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def held(self, timeout: float, busy: Callable[[str], Exception]) -> Iterator["Lease"]:
        self.acquire(timeout, busy)
        try:
            yield self
        finally:
            self.release()
