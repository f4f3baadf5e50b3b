"""The container runtimes' arguments (apptainer, pyxis) and OCI bundles (cluster.container=oci).

One place builds each runtime's flags, so the ranks' step and the in-image supervisor's step run
with the same ones (the finding of issue 35: pyxis flags given in cluster.srun_extra reached the
ranks and not the supervisor, whose mounts then differed). What is mounted, for every runtime: the
runs root at its own path, cluster.container_binds (SRC[:DST[:ro]]), and read-only every file the
job reads that lies outside the runs root (token files with their .json sidecars,
model.pretrained_path) unless a bind covers it. Values are checked at login
(common/validation_container.py) and reach the script through shlex.quote.

`cluster.image` for oci is an OCI bundle every node sees; each task runs its own `runc run` on
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
from slurmtrain.common.validation_container import (
    APPTAINER_GPU,
    Bind,
    check_container,
    flag_name,
    is_pyxis_flag,
    parse_bind,
)

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


def _bind(path: str, mode: str = "rw", source: str | None = None) -> OciMount:
    return {
        "destination": path,
        "type": "bind",
        "source": source or path,
        "options": ["rbind", mode],
    }


# Host paths an image's bundle binds that the job only reads (tools/oci_spec.py binds the first two
# read-write): the ranks run as root in the host's namespaces, so a writable bind is a writable
# host /etc/slurm. A unix socket still connects on a read-only bind (munge's, scontrol's client).
READ_ONLY_HOST = ("/etc/slurm", "/run/munge", "/etc/munge", "/etc/hosts", "/etc/resolv.conf")


def read_only(mount: OciMount) -> OciMount:
    """`mount` read-only when it binds a host path in READ_ONLY_HOST (others as the image has them)."""
    if mount.get("type") != "bind" or mount.get("destination") not in READ_ONLY_HOST:
        return mount
    options = [o for o in mount.get("options", []) if o not in ("rw", "ro")]
    return {**mount, "options": [*options, "ro"]}


def run_bundle(cfg: RootConfig, image_spec: OciSpec) -> OciSpec:
    """The run's config.json: the image's, root absolute, the runs root (checkpoints, ledger,
    logs) and the host's /dev/shm (the task's script; gloo/NCCL shared memory) mounted at the
    same paths, the host's configuration read-only (READ_ONLY_HOST), the process the task's
    script; terminal off (srun has no tty)."""
    spec: OciSpec = json.loads(json.dumps(image_spec))  # a deep copy of plain JSON
    spec["root"]["path"] = str(rootfs(str(cfg.cluster.image), spec))
    runs_root = str(Path(str(cfg.runs_root)).resolve())
    keep = [
        read_only(m)
        for m in spec.get("mounts", [])
        if m.get("destination") not in (runs_root, "/dev/shm")
    ]
    extra = [_bind(b.dst, "ro" if b.read_only else "rw", b.src) for b in binds(cfg)]
    taken = {runs_root, "/dev/shm", *(m["destination"] for m in extra)}
    keep = [m for m in keep if m.get("destination") not in taken]
    spec["mounts"] = [*keep, _bind("/dev/shm"), _bind(runs_root), *extra]
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


# pyxis flags that take their value as the next srun_extra element when written without `=`.
PYXIS_VALUED = ("--container-workdir", "--container-name", "--container-save", "--container-env")


def runs_root(cfg: RootConfig) -> str:
    return os.path.abspath(str(cfg.runs_root))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def job_files(cfg: RootConfig) -> list[str]:
    """Absolute paths the ranks read besides the runs root: token files (each with the .json
    sidecar data.py reads its dtype from) and model.pretrained_path."""
    d = cfg.data
    kind = str(d.kind)
    names: list[str] = []
    if kind == "tokens" and d.path:
        names.append(str(d.path))
    elif kind == "text" and d.tokens_path:
        names.append(str(d.tokens_path))
    elif kind == "blend":
        names += [str(s.path) for s in d.sources]
    if d.valid_path:
        names.append(str(d.valid_path))
    out = [p for n in names for p in (n, str(Path(n).with_suffix(".json")))]
    if cfg.model.pretrained_path:
        out.append(str(cfg.model.pretrained_path))
    return [os.path.abspath(p) for p in out]


def binds(cfg: RootConfig) -> list[Bind]:
    """What is mounted besides the runs root: cluster.container_binds, then read-only each job
    file outside the runs root that no bind (nor the runs root) covers."""
    own = [parse_bind(b) for b in cfg.cluster.container_binds]
    root = runs_root(cfg)
    covered = [root, *(b.src for b in own if b.src == b.dst)]
    auto: list[Bind] = []
    for path in job_files(cfg):
        if not any(_under(path, c) for c in covered) and path not in {b.src for b in auto}:
            auto.append(Bind(path, path, True))
    # checkpoint.dir outside the runs root: written by the ranks, so mounted read-write
    saves = str(cfg.checkpoint.dir or "")
    if saves:
        saves = str(Path(saves).expanduser().resolve())
        if not any(_under(saves, c) for c in covered):
            auto.append(Bind(saves, saves, False))
    return own + auto


def apptainer_command(cfg: RootConfig) -> list[str]:
    """`apptainer exec` with the GPU flag, cluster.container_flags and every bind, then python."""
    c = cfg.cluster
    if not c.image:
        raise ConfigError(
            "cluster.image=None: cluster.container=apptainer needs an image; "
            "set cluster.image=PATH.sif"
        )
    check_container(cfg)  # the image too: one line now, not a job that ends config_error
    gpu = APPTAINER_GPU[str(c.apptainer_gpu)]
    args = [str(c.apptainer_binary), "exec", *([gpu] if gpu else [])]
    args += [str(f) for f in c.container_flags]
    args += ["--bind", runs_root(cfg)]
    for b in binds(cfg):
        args += ["--bind", b.spec()]
    return [*args, str(c.image), "python"]


def split_srun_extra(cfg: RootConfig) -> tuple[list[str], list[str]]:
    """cluster.srun_extra as (other srun flags, pyxis flags): with cluster.container=pyxis the
    pyxis ones (--container-*, --no-container-*) join the container's flags, which the ranks'
    and the supervisor's steps both get; otherwise all stay where they are."""
    extra = [str(a) for a in cfg.cluster.srun_extra]
    if str(cfg.cluster.container) != "pyxis":
        return extra, []
    plain: list[str] = []
    pyxis: list[str] = []
    take_next = False
    for arg in extra:
        if take_next or is_pyxis_flag(arg):
            pyxis.append(arg)
            take_next = not take_next and "=" not in arg and flag_name(arg) in PYXIS_VALUED
        else:
            plain.append(arg)
    return plain, pyxis


def pyxis_args(cfg: RootConfig) -> list[str]:
    """pyxis' srun flags for every step that runs in the image: the image, the runs root and
    every bind in one --container-mounts, cluster.container_flags, srun_extra's pyxis flags."""
    image = cfg.cluster.image
    if not image:
        raise ConfigError(
            "cluster.image=None: cluster.container=pyxis needs an image; set "
            "cluster.image=REGISTRY#IMAGE or a .sqsh path"
        )
    check_container(cfg)
    root = runs_root(cfg)
    mounts = ",".join([f"{root}:{root}", *(b.spec() for b in binds(cfg))])
    flags = [str(f) for f in cfg.cluster.container_flags]
    return [f"--container-image={image}", f"--container-mounts={mounts}", *flags,
            *split_srun_extra(cfg)[1]]  # fmt: skip
