"""OCI containers (cluster.container=oci): the image check and the run's runc bundle.

`cluster.image` is an OCI bundle every node sees; each task runs its own `runc run` on
RUN_DIR/oci/config.json: the image's, root absolute, runs root and /dev/shm bind-mounted at the
same paths. Not Slurm 22.05's `srun --container`: it starts one task per node, hides the task's
SLURM_PROCID/LOCALID/NODEID and cannot take a per-run mount.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig

IMAGE_PYTHON = "python3"  # found on the job's PATH inside the image (Slurm passes the job's env)
PATH_DIRS = ("usr/local/bin", "usr/bin", "bin")
FIX = (
    "build one with tools/build_image.sh, or point cluster.image at a bundle whose root has python3"
)


class OciRoot(TypedDict, total=False):
    path: str


class OciMount(TypedDict, total=False):
    destination: str
    type: str
    source: str
    options: list[str]


class OciProcess(TypedDict, total=False):
    terminal: bool
    args: list[str]
    cwd: str


class OciSpec(TypedDict, total=False):
    """The keys of an OCI bundle's config.json this module reads or sets (others pass through)."""

    root: OciRoot
    mounts: list[OciMount]
    process: OciProcess


def _spec(image: str) -> OciSpec:
    config = Path(image) / "config.json"
    try:
        spec: OciSpec = json.loads(config.read_text())  # checked below
    except OSError as exc:
        raise ConfigError(
            f"cluster.image={image}: not an OCI bundle (cannot read {config}: "
            f"{exc.strerror}); {FIX}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"cluster.image={image}: {config} is not JSON ({exc}); {FIX}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("root"), dict):
        raise ConfigError(f"cluster.image={image}: {config} has no root; {FIX}")
    return spec


def rootfs(image: str, spec: OciSpec) -> Path:
    root = Path(str(spec["root"].get("path", "rootfs")))
    return root if root.is_absolute() else Path(image).resolve() / root


def image_python(root: Path) -> Path | None:
    """The image's python3 (a path inside `root` that resolves within it), or None."""
    for d in PATH_DIRS:
        candidate = root / d / IMAGE_PYTHON
        target = candidate
        for _ in range(8):  # symlinks inside an image are relative to the image's root
            if not target.is_symlink():
                break
            link = os.readlink(target)
            target = root / link.lstrip("/") if link.startswith("/") else target.parent / link
        if target.is_file() and os.access(target, os.X_OK):
            return candidate
    return None


def check_image(cfg: RootConfig) -> OciSpec:
    """The image's config.json, or one line naming cluster.image, what is wrong and the fix.
    Checked on the login node at the dry run and at submission: nothing is queued that cannot
    start its Python."""
    return check_image_path(cfg.cluster.image)


def check_image_path(image: str | None) -> OciSpec:
    """check_image for a bundle path (the doctor's --image)."""
    if not image:
        raise ConfigError(
            "cluster.image=None: cluster.container=oci needs an OCI bundle; set "
            "cluster.image=DIR (a directory with config.json and rootfs/, e.g. from "
            "tools/build_image.sh)"
        )
    spec = _spec(str(image))
    root = rootfs(str(image), spec)
    if not root.is_dir():
        raise ConfigError(f"cluster.image={image}: its root {root} is not a directory; {FIX}")
    if image_python(root) is None:
        where = ", ".join(f"/{d}" for d in PATH_DIRS)
        raise ConfigError(
            f"cluster.image={image}: the image has no {IMAGE_PYTHON} (looked in {where} of "
            f"{root}); {FIX}"
        )
    return spec


TASK_DIR = "@TASK_DIR@"  # replaced per task by its node-local directory (oci_task, in /dev/shm)
BUNDLE_DIR = "oci"  # RUN_DIR/oci/config.json


def _bind(path: str, mode: str = "rw") -> OciMount:
    return {"destination": path, "type": "bind", "source": path, "options": ["rbind", mode]}


def run_bundle(cfg: RootConfig, image_spec: OciSpec) -> OciSpec:
    """The run's config.json: the image's, root absolute, the runs root (checkpoints, ledger,
    logs) and the host's /dev/shm (the task's script; gloo/NCCL shared memory) mounted at the
    same paths, the process the task's script; terminal off (srun has no tty)."""
    spec: OciSpec = json.loads(json.dumps(image_spec))  # a deep copy of plain JSON
    spec["root"]["path"] = str(rootfs(str(cfg.cluster.image), spec))
    runs_root = str(Path(str(cfg.runs_root)).resolve())
    keep = [
        m for m in spec.get("mounts", []) if m.get("destination") not in (runs_root, "/dev/shm")
    ]
    spec["mounts"] = [*keep, _bind("/dev/shm"), _bind(runs_root)]
    process = spec.setdefault("process", {})
    process["terminal"] = False
    process["args"] = ["/bin/bash", f"{TASK_DIR}/run"]
    process["cwd"] = "/"
    return spec


def write_bundle(cfg: RootConfig, run_dir: Path) -> None:
    """RUN_DIR/oci/config.json for cluster.container=oci (nothing otherwise); written with the
    batch script, so a hand `sbatch job.sbatch` finds it too."""
    if cfg.cluster.container != "oci":
        return
    spec = run_bundle(cfg, check_image(cfg))
    target = Path(run_dir) / BUNDLE_DIR / "config.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1) + "\n")
    tmp.replace(target)
