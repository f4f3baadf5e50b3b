"""What produced a result: code version, packages, libraries, nodes, environment — secrets redacted.

Written at submission (login node: the user's git tree) and at every attempt (compute node: what
actually ran there), under `provenance/`.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Mapping, Optional

from slurmtrain.common.commands import run_cmd
from slurmtrain.common.secrets import (
    NAMES_VAR,
    REDACTED,
    SECRET_ENV_NAME,
    redact_overrides,
    redact_text,
)

RECORDED_ENV = re.compile(
    r"^(SLURM_|SUBMITIT_|CUDA_|NCCL_|TORCH_|DS_|OMP_|MASTER_|WORLD_SIZE|RANK|"
    r"LOCAL_RANK|PYTHON|HOSTNAME|PATH$|LD_LIBRARY_PATH|VIRTUAL_ENV|CONDA_|"
    r"HF_|TRANSFORMERS_|WANDB_|SLURMTRAIN_)"
)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """The variables worth recording, with anything secret-looking replaced."""
    out = {}
    given = set(env.get(NAMES_VAR, "").split())  # every variable secrets.env set
    for key, value in sorted(env.items()):
        if not RECORDED_ENV.match(key):
            continue
        secret = key in given or SECRET_ENV_NAME.search(key)
        out[key] = REDACTED if secret else redact_text(value)
    return out


def _run(args: list[str], cwd: Optional[str] = None) -> Optional[str]:
    cmd = run_cmd(args, timeout=20, cwd=cwd)
    return cmd.out if cmd.ok else None


@functools.lru_cache(maxsize=8)
def git_state(cwd: str) -> dict[str, object]:
    sha = _run(["git", "rev-parse", "HEAD"], cwd)
    if sha is None:
        return {"git": None}
    diff = _run(["git", "diff", "HEAD"], cwd) or ""
    return {
        "git": sha.strip(),
        "git_dirty": bool(diff.strip()),
        "git_diff": redact_text(diff),
    }


@functools.lru_cache(maxsize=1)
def packages() -> list[str]:
    """`pip freeze` without spawning pip: name==version of every installed distribution."""
    seen = set()
    for dist in metadata.distributions():
        name, version = _name_version(dist)
        if name:
            seen.add(f"{name}=={version}")
    return sorted(seen, key=str.lower)


def _name_version(dist: metadata.Distribution) -> tuple[Optional[str], Optional[str]]:
    """`dist.metadata["Name"]` and `dist.version` from the metadata's header lines alone: the email
    parser behind `dist.metadata` reads every package's whole description, twice (~10x slower)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # end of the header
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key in ("name", "version") and key not in found:
            found[key] = value.strip()
    return found.get("name"), found.get("version")


def glibc() -> Optional[str]:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return None


def versions() -> dict[str, object]:
    """Library versions; torch/deepspeed only if this process already imported them (compute node)."""
    out: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "glibc": glibc(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    ds = sys.modules.get("deepspeed")
    if ds is not None:
        out["deepspeed"] = ds.__version__
    return out


def write(
    directory: Path,
    label: str,
    extra: Optional[Mapping[str, object]] = None,
    cwd: Optional[str] = None,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    # Cached per process: a 64-point sweep records the same tree and packages 64 times.
    record = {
        "label": label,
        "time": time.time(),
        "host": socket.gethostname(),
        "argv": redact_overrides(sys.argv),  # cluster.env.X=... too, not only token shapes
        "versions": versions(),
        **git_state(cwd or os.getcwd()),
        "env": redact_env(dict(os.environ)),
        **(extra or {}),
    }
    path = directory / f"{label}.json"
    _write_private(path, json.dumps(record, indent=1, default=str))
    _write_private(directory / f"{label}.pip-freeze.txt", "\n".join(packages()) + "\n")
    return path


def _write_private(path: Path, text: str) -> None:
    """Not world-readable whatever the umask (a run's records are the user's and their group's)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with open(fd, "w") as f:
        f.write(text)
