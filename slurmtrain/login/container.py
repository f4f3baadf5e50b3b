"""Slurm's native OCI containers (cluster.container=oci): the image check and the run's bundle.

`cluster.image` names an OCI bundle (a directory with config.json and rootfs/, e.g. from
tools/build_image.sh) on a path every node sees. Slurm 22.05's `srun --container=DIR` runs each
task in DIR's config.json (through the runtime oci.conf names) with the job's environment and
argv, and mounts nothing of its own. So the bundle's config.json must bind-mount the runs root at
the same path (what pyxis' --container-mounts and Apptainer's --bind do per job); this is checked
here, before anything is queued. A per-run bundle cannot do it: Slurm always runs DIR/rootfs
(whatever root.path says) and runc refuses a rootfs that is a symlink (both verified on 22.05).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig

from slurmtrain.common.errors import ConfigError

IMAGE_PYTHON = "python3"  # found on the job's PATH inside the image (Slurm passes the job's env)
PATH_DIRS = ("usr/local/bin", "usr/bin", "bin")
FIX = (
    "build one with tools/build_image.sh, or point cluster.image at a bundle whose root has python3"
)


def _spec(image: str) -> dict:
    config = Path(image) / "config.json"
    try:
        spec = json.loads(config.read_text())
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


def rootfs(image: str, spec: dict) -> Path:
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


def check_image(cfg: DictConfig) -> dict:
    """The image's config.json, or one line naming cluster.image, what is wrong and the fix.
    Checked on the login node at the dry run and at submission: nothing is queued that cannot
    start its Python."""
    spec = check_image_path(cfg.cluster.image)
    runs_root = str(Path(str(cfg.runs_root)).resolve())
    if not mounts_runs_root(spec, runs_root):
        raise ConfigError(
            f"cluster.image={cfg.cluster.image}: its config.json does not bind-mount "
            f"runs_root={runs_root} (read-write, same path), so checkpoints would be lost; "
            f"rebuild it with tools/build_image.sh --mount {runs_root}, or add that mount"
        )
    return spec


def check_image_path(image: str | None) -> dict:
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


def mounts_runs_root(spec: dict, runs_root: str) -> bool:
    """Whether a bind mount in the bundle shows `runs_root` at the same path inside."""
    root = Path(runs_root).resolve()
    for m in spec.get("mounts", []):
        options = m.get("options", [])
        if m.get("type") != "bind" and not {"bind", "rbind"} & set(options):
            continue
        src, dst = Path(str(m.get("source", ""))), Path(str(m.get("destination", "")))
        if src == dst and (root == src or src in root.parents):
            return "ro" not in options
    return False
