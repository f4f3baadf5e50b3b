"""cluster.stage_env: the ranks run Python from a node-local copy of the environment.

Thousands of ranks importing torch from the shared filesystem at the same second slow every start
(and the filesystem for everyone). With the option on, the login node packs the venv once
(`<stage_env_cache>/<key>.tar.zst` and its manifest, the key hashing prefix, Python version and
site-packages, so resubmissions reuse it once it matches its manifest); the batch script unpacks it
once per node into `<stage_env_dir>/slurmtrain-envs-<uid>/<key>-<node>` (the user's own 0700
directory: no other user can plant a python there; the node name keeps nodes sharing one disk
apart), and every rank execs that copy's python. A node without a copy runs the shared python,
which still works.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from slurmtrain.common import ownership
from slurmtrain.common.durable import replace_atomically
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig

PREFIX = "slurmtrain-envs-"  # + uid: each user's own 0700 directory of copies on a node

# Per node (one task each): unpack the pack into this node's copy unless it is there. $0: the
# node-local directory, $1: the key, $2: the pack. Trusts nothing it did not make: copies live in
# the user's own 0700 directory (made here, or checked: ours, no link, 0700; $0 sticky or writable
# by nobody else, or another user could rename ours away); the pack is checked against its manifest
# (size, sha256) as it is read; it is extracted into a fresh mktemp directory renamed into place
# once complete (a partial copy never looks done), one job at a time per copy (flock), so partial
# copies of killed jobs are removed and redone.
UNPACK = r"""u=$(id -u); p="$0/slurmtrain-envs-$u"; name="$1-$SLURMD_NODENAME"; d="$p/$name"
no() { echo "slurmtrain: not staging the environment on $SLURMD_NODENAME: $*" >&2; exit 1; }
[ -d "$0" ] || mkdir -p -m 0700 -- "$0" || no "cannot create $0"
case "$(stat -L -c %a -- "$0")" in
  [1357]???) ;;
  *[2367]?|*[2367]) no "$0 is writable by others and not sticky (chmod +t or go-w it)" ;;
esac
[ -L "$p" ] && no "$p is a symbolic link (remove it)"
mkdir -m 0700 -- "$p" 2>/dev/null
[ "$(stat -c '%u %a' -- "$p")" = "$u 700" ] || no "$p is not yours with mode 0700 (remove it)"
[ -x "$d/bin/python" ] && exit 0
exec 9>"$p/.lock-$name" || no "cannot create $p/.lock-$name"
if command -v flock >/dev/null; then
  flock 9; [ -x "$d/bin/python" ] && exit 0
  rm -rf "$p/.partial-$name".*
fi
read -r sum size < "$2.manifest" || no "$2.manifest is missing (submit again)"
[ "$(stat -L -c %s -- "$2")" = "$size" ] || no "$2 is not the size its manifest says"
t=$(mktemp -d "$p/.partial-$name.XXXXXX") || no "mktemp in $p failed"
mkdir "$t/env" && mkfifo "$t/pipe" || { rm -rf "$t"; no "cannot write in $t"; }
sha256sum < "$t/pipe" > "$t/sum" &
case "$2" in *.zst) z="-I zstd" ;; *) z="" ;; esac
tee "$t/pipe" < "$2" | tar $z -xf - -C "$t/env" || { wait; rm -rf "$t"; no "extracting $2 failed"; }
wait
[ "$(cut -d' ' -f1 "$t/sum")" = "$sum" ] || { rm -rf "$t"; no "$2 does not match its manifest"; }
mv -T "$t/env" "$d" 2>/dev/null; rm -rf "$t"
[ -x "$d/bin/python" ]"""

# Every rank: this node's copy's python when it is complete and in the user's own 0700
# directory, else the shared one ($2).
RUN = r'''u=$(id -u); p="$0/slurmtrain-envs-$u"; d="$p/$1-$SLURMD_NODENAME"; shared="$2"; shift 2
if [ ! -L "$p" ] && [ "$(stat -c '%u %a' -- "$p" 2>/dev/null)" = "$u 700" ] && [ -x "$d/bin/python" ]
then export SLURMTRAIN_STAGED_ENV="$d"; exec "$d/bin/python" "$@"; fi
echo "slurmtrain: no staged environment at $d; running $shared" >&2
exec "$shared" "$@"'''


def environment_prefix() -> Path:
    """The environment the ranks would run: the submitting python's venv (or conda env)."""
    prefix = Path(sys.prefix)
    if sys.prefix == sys.base_prefix and not (prefix / "conda-meta").is_dir():
        raise ConfigError(
            f"cluster.stage_env=true: the submitting python ({sys.executable}) is not in a "
            f"virtual environment (sys.prefix={sys.prefix}), so there is nothing to stage; "
            f"submit from the venv that trains (python -m venv), or set cluster.stage_env=false"
        )
    return prefix


def pack_key(prefix: Path) -> str:
    """Changes when the environment does: its path, Python's version, what is installed (the
    site-packages listing and its mtime: an install or removal touches it). O(1) stats."""
    h = hashlib.sha256(f"{prefix}\n{sys.version}".encode())
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        h.update(f"{site}:{site.stat().st_mtime_ns}:".encode())
        h.update("\n".join(sorted(os.listdir(site))).encode())
    return h.hexdigest()[:16]


def cache_dir(cfg: RootConfig) -> Path:
    """Where packs live: cluster.stage_env_cache, else <runs_root>/.env_packs (compute nodes read
    runs_root, so it is on a filesystem they see)."""
    return Path(cfg.cluster.stage_env_cache or Path(str(cfg.runs_root)) / ".env_packs").expanduser()


def pack_path(cfg: RootConfig, key: str) -> Path:
    return cache_dir(cfg) / (f"{key}.tar.zst" if shutil.which("zstd") else f"{key}.tar")


def manifest(path: Path) -> Path:
    """`<pack>.manifest`: `<sha256> <size>` (each node checks the pack against it as it reads it),
    then the pack's `<inode> <ctime_ns>` when that hash was checked here."""
    return path.with_name(path.name + ".manifest")


def verified(path: Path) -> bool:
    """The pack exists, is ours, writable by nobody else, and matches its manifest: its size,
    and its sha256 unless its inode and ctime are those it had when the hash was last checked
    (any write changes ctime, and nobody but root sets it back): ~4 s per GB saved a submission."""
    try:
        st = os.lstat(path)
        lines = manifest(path).read_text().splitlines()
        want_sum, want_size = lines[0].split()
    except (OSError, ValueError, IndexError):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return False
    if st.st_size != int(want_size):
        return False
    if lines[1:2] == [f"{st.st_ino} {st.st_ctime_ns}"]:
        return True
    if sha256_of(path) != want_sum:
        return False
    _write_manifest(path, want_sum, st)
    return True


def _write_manifest(path: Path, digest: str, st: os.stat_result) -> None:
    text = f"{digest} {st.st_size}\n{st.st_ino} {st.st_ctime_ns}\n"
    replace_atomically(manifest(path), text, mode=0o600, durable=False)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**22), b""):
            h.update(block)
    return h.hexdigest()


def ensure_pack(cfg: RootConfig) -> Path:
    """The pack of this environment, made now unless a verified one exists (login node). Its
    directory is made with run_dir_mode, or refused when another user made it (common/ownership)."""
    prefix = environment_prefix()
    path = pack_path(cfg, pack_key(prefix))
    mode = ownership.dir_mode(getattr(cfg, "run_dir_mode", None))
    ownership.make_dir(path.parent, mode, "environment pack directory")
    if verified(path):
        return path
    if path.exists():
        print(f"slurmtrain: {path} does not match its manifest; packing again", file=sys.stderr)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    compress = ["-I", "zstd -T0 -1"] if path.suffix == ".zst" else []
    print(f"slurmtrain: packing {prefix} once for cluster.stage_env -> {path}", file=sys.stderr)
    t0 = time.time()
    # __pycache__ travels: compiled bytecode is what makes the node-local imports fast
    done = subprocess.run(
        ["tar", *compress, "-cf", str(tmp), "-C", str(prefix), "."],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"cluster.stage_env=true: packing {prefix} into {tmp} failed "
            f"({done.stderr.strip()[-300:]}); set cluster.stage_env_cache=DIR on a filesystem "
            f"with room, or cluster.stage_env=false"
        )
    digest = sha256_of(tmp)
    _write_manifest(path, digest, tmp.stat())  # before the pack: a node never sees it unlisted
    os.replace(tmp, path)  # two submissions packing at once: the same bytes, either wins
    _write_manifest(path, digest, path.stat())  # its ctime once in place
    size = path.stat().st_size / 2**20
    print(f"slurmtrain: packed {size:.0f} MiB in {time.time() - t0:.1f} s", file=sys.stderr)
    return path


def node_dir(cfg: RootConfig) -> str:
    """The node-local directory that holds each user's directory of copies."""
    return str(cfg.cluster.stage_env_dir).rstrip("/") or "/"


def script_values(cfg: RootConfig, pack: bool = False) -> Optional[dict[str, str]]:
    """What the batch script's staging block needs (None: the option is off). `pack`: make the
    pack now (submission); a dry run only names it."""
    if not cfg.cluster.stage_env:
        return None
    key = pack_key(environment_prefix())
    archive = ensure_pack(cfg) if pack else pack_path(cfg, key)
    return {"dir": node_dir(cfg), "key": key, "archive": str(archive), "unpack": UNPACK}


def python_command(cfg: RootConfig, shared: list[str]) -> list[str]:
    """The ranks' interpreter: this node's staged python, falling back to `shared`'s."""
    key = pack_key(environment_prefix())
    return ["/bin/sh", "-c", RUN, node_dir(cfg), key, *shared]
