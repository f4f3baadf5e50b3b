"""cluster.stage_env: the ranks run Python from a node-local copy of the environment.

Thousands of ranks importing torch from the shared filesystem at the same second slow every start
(and the filesystem for everyone). With the option on, the login node packs the venv once
(`<stage_env_cache>/<key>.tar.zst`, the key hashing prefix, Python version and site-packages, so
resubmissions reuse it); the batch script unpacks it once per node into
`<stage_env_dir>/slurmtrain-env-<key>-<node>` (the node name keeps nodes sharing one disk apart),
and every rank execs that copy's python. A node without a copy runs the shared python, which
still works.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig

PREFIX = "slurmtrain-env-"

# Per node (one task each): unpack the pack into this node's directory unless it is there;
# atomic (a partial unpack never looks done). $0: the directory's stem, $1: the pack.
UNPACK = r"""d="$0$SLURMD_NODENAME"
[ -x "$d/bin/python" ] && exit 0
t="$d.partial.$SLURM_JOB_ID.$$"
rm -rf "$t"; mkdir -p "$t" || exit 1
case "$1" in *.zst) tar -I zstd -xf "$1" -C "$t" ;; *) tar -xf "$1" -C "$t" ;; esac || { rm -rf "$t"; exit 1; }
mv -T "$t" "$d" 2>/dev/null || rm -rf "$t"
[ -x "$d/bin/python" ]"""

# Every rank: this node's copy's python when it is complete, else the shared one ($1).
RUN = r'''d="$0$SLURMD_NODENAME"; shared="$1"; shift
if [ -x "$d/bin/python" ]; then export SLURMTRAIN_STAGED_ENV="$d"; exec "$d/bin/python" "$@"; fi
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


def ensure_pack(cfg: RootConfig) -> Path:
    """The pack of this environment, made now unless an identical one exists (login node)."""
    prefix = environment_prefix()
    path = pack_path(cfg, pack_key(prefix))
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
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
    os.replace(tmp, path)  # two submissions packing at once: the same bytes, either wins
    size = path.stat().st_size / 2**20
    print(f"slurmtrain: packed {size:.0f} MiB in {time.time() - t0:.1f} s", file=sys.stderr)
    return path


def stem(cfg: RootConfig, key: str) -> str:
    """Each node's copy: this plus its node name (SLURMD_NODENAME)."""
    return f"{str(cfg.cluster.stage_env_dir).rstrip('/')}/{PREFIX}{key}-"


def script_values(cfg: RootConfig, pack: bool = False) -> Optional[dict[str, str]]:
    """What the batch script's staging block needs (None: the option is off). `pack`: make the
    pack now (submission); a dry run only names it."""
    if not cfg.cluster.stage_env:
        return None
    prefix = environment_prefix()
    key = pack_key(prefix)
    archive = ensure_pack(cfg) if pack else pack_path(cfg, key)
    return {"stem": stem(cfg, key), "archive": str(archive), "unpack": UNPACK}


def python_command(cfg: RootConfig, shared: list[str]) -> list[str]:
    """The ranks' interpreter: this node's staged python, falling back to `shared`'s."""
    key = pack_key(environment_prefix())
    return ["/bin/sh", "-c", RUN, stem(cfg, key), *shared]
