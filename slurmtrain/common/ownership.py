"""Who may touch what slurmtrain makes: explicit modes whatever the umask, and what others own refused.

A login node is shared: a directory another user made first (or can write) lets him swap a run
directory, plant a program, or hold the run's lock. So every directory slurmtrain creates gets
`run_dir_mode` (0700 by default) by chmod after mkdir; the process's umask is tightened to match
(files, and the job sbatch starts: Slurm passes the submitter's umask on); and an existing run
directory that is a symbolic link, owned by another user, or writable by more than the mode grants
is refused in one line naming the path, its owner and the fix. The lock file is opened O_RDWR and
O_NOFOLLOW, created 0600 (0660 where the mode grants the group write): whoever cannot write the
run cannot open it to flock.
"""

from __future__ import annotations

import os
import pwd
import stat
import threading
from pathlib import Path
from typing import Optional

from slurmtrain.common.errors import ConfigError

_UMASK = threading.Lock()  # a sweep locks its runs from a thread pool (login/run_locks.py)
DEFAULT_MODE = 0o700  # schema.RootConfig.run_dir_mode's default
FIX_ROOT = "choose a runs_root you own, e.g. runs_root=$HOME/slurmtrain-runs"


def dir_mode(value: object) -> int:
    """run_dir_mode's value (validated at login: validation_login.check_run_dir_mode) as bits."""
    return int(str(value), 8) if value else DEFAULT_MODE


def lock_mode(mode: Optional[int]) -> int:
    """The lock's and lease's mode: only those who may write the run may open them."""
    return 0o660 if mode is not None and mode & 0o020 else 0o600


def tighten_umask(mode: Optional[int]) -> None:
    """Files this process (and the job it submits) creates get no more than the run's mode; never
    world-writable. Only ever narrows the umask the user chose."""
    narrower = (0o777 & ~(mode if mode is not None else DEFAULT_MODE)) | 0o002
    if _umask_now() & narrower == narrower:  # already: a sweep's points narrow it side by side,
        return  # and setting it (077 meanwhile) would narrow another thread's new files
    with _UMASK:  # read by setting it (the only way): meanwhile 077, never looser, for any thread
        old = os.umask(0o077)
        os.umask(old | narrower)


def _umask_now() -> int:
    """The umask read without setting it (Linux: /proc/self/status); 0 (unknown) elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _loose(st: os.stat_result, mode: Optional[int]) -> int:
    """The write bits `st` gives others beyond what `mode` grants (the group's when it grants it)."""
    allowed = 0o020 if mode is not None and mode & 0o020 else 0
    if mode is None:  # the compute side: the login side checked the group's bit at submission
        allowed = 0o020
    return stat.S_IMODE(st.st_mode) & 0o022 & ~allowed


def check_dir(path: Path, mode: Optional[int], what: str = "run directory") -> None:
    """Refuse (ConfigError, one line) a `path` that is another's link, not ours, or writable by
    others. A link of our own (runs/NAME -> /scratch/...) is followed: only we could make it."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid() and os.path.isdir(path):
        st = os.stat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{what} {path} is a symbolic link (to {os.readlink(path)}) owned by "
            f"{user(st.st_uid)}: another user may have planted it; remove it (rm {path}) or "
            f"{FIX_ROOT}"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {path} is not a directory; remove it (rm {path}) or {FIX_ROOT}")
    me = os.geteuid()
    if st.st_uid != me:
        raise ConfigError(
            f"{what} {path} is owned by {user(st.st_uid)}, not by you, {user(me)}: another user "
            f"made or replaced it and could change what runs; remove it (or ask its owner to) "
            f"and submit again, or {FIX_ROOT}"
        )
    loose = _loose(st, mode)
    if loose:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002)) if loose & bit)
        fix = oct(mode if mode is not None else DEFAULT_MODE)[2:].zfill(4)
        raise ConfigError(
            f"{what} {path} (owner {user(st.st_uid)}) is writable by {who} (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): they could swap or take the run; chmod {fix} {path} "
            f"(or set run_dir_mode=0770 to share it with the group)"
        )


def check_root(root: Path, mode: Optional[int]) -> None:
    """runs_root: owned by us (or root), and not writable by others unless sticky (/tmp's rule:
    nobody renames what another owns there)."""
    st = os.stat(root)
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"runs_root {root} is owned by {user(st.st_uid)}, not by you, {user(os.geteuid())}: "
            f"its owner could swap your runs; {FIX_ROOT}"
        )
    if _loose(st, mode) and not st.st_mode & stat.S_ISVTX:
        raise ConfigError(
            f"runs_root {root} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, not "
            f"sticky): anyone could swap your runs; chmod go-w {root} (or chmod +t), or {FIX_ROOT}"
        )


def make_dir(path: Path, mode: Optional[int], what: str = "run directory") -> None:
    """`path` and its missing parents made with `mode` whatever the umask; the last checked (ours,
    no link, no more writable than `mode`) and given `mode` exactly when it is ours already."""
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    bits = mode if mode is not None else DEFAULT_MODE
    for p in reversed(missing):
        try:
            os.mkdir(p, bits)
        except FileExistsError:
            continue  # made meanwhile: checked below if it is the one we use
        os.chmod(p, bits)  # mkdir's mode is filtered by the umask
    check_dir(path, mode, what)
    if mode is not None and stat.S_IMODE(os.lstat(path).st_mode) != mode:
        os.chmod(path, mode)


def make_run_dir(run_path: Path, mode: Optional[int]) -> None:
    """A run directory `<runs_root>/<name>/<fingerprint>` and its parents: made with `mode`,
    or refused when another user made (or can swap) one of them. The umask is narrowed to match
    (mode None, the compute side: to the run directory's own mode, which the login side gave it)."""
    root = run_path.parent.parent
    if not os.path.lexists(root):
        make_dir(root, mode, "runs_root")
    check_root(root, mode)
    make_dir(run_path.parent, mode, "run name directory")
    make_dir(run_path, mode)
    tighten_umask(mode if mode is not None else stat.S_IMODE(os.lstat(run_path).st_mode))


def check_existing(run_path: Path, mode: Optional[int]) -> None:
    """make_run_dir's refusals, making nothing (a dry run says what the submission would)."""
    root = run_path.parent.parent
    if os.path.lexists(root):
        check_root(root, mode)
    for path, what in ((run_path.parent, "run name directory"), (run_path, "run directory")):
        if os.path.lexists(path):
            check_dir(path, mode, what)


def private_dir(path: Path) -> Path:
    """A per-user 0700 directory at a predictable path (under /tmp): made, or checked to be ours,
    no link, 0700, before anything in it is trusted."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_dir(path, 0o700, "private directory")
    if stat.S_IMODE(os.lstat(path).st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def open_lock(path: Path, mode: Optional[int]) -> int:
    """The lock file's descriptor: O_RDWR (a read-only user could flock an O_RDONLY one),
    O_NOFOLLOW (no link planted in its place), created lock_mode(mode) and repaired to it."""
    want = lock_mode(mode)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, want)
    except OSError as err:
        if os.path.islink(path):
            raise ConfigError(
                f"run lock {path} is a symbolic link: another user may have planted it; "
                f"remove it (rm {path}) and submit again"
            ) from None
        raise err
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != want and mode is not None:
        os.fchmod(fd, want)
    return fd
