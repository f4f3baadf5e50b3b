"""Container settings checked on the login node (issue 35, build 5): cluster.container_binds,
cluster.container_flags, cluster.apptainer_binary, cluster.apptainer_gpu, and the pyxis flags that
slurmtrain owns in cluster.srun_extra.

cluster.image for apptainer and pyxis (check_image_file): a path is an image of the runtime's kind
(read here, as login/container.py reads an OCI bundle), else refused before anything is queued.

Each failure is one ConfigError line naming the key, the value and the fix. Values that pass reach
the batch script through shlex.quote (login/container.py), never unquoted; what is refused here is
what would mean something else than it says: a `$VAR` that would stay literal, a comma that splits
one bind into two, a flag that replaces one slurmtrain sets.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig

APPTAINER_NAMES = ("apptainer", "singularity")
APPTAINER_GPU = {"nv": "--nv", "rocm": "--rocm", "none": None}
# apptainer exec flags slurmtrain sets -> the key that sets them.
APPTAINER_OWNED = {
    "--bind": "cluster.container_binds=[SRC:DST]",
    "-B": "cluster.container_binds=[SRC:DST]",
    "--nv": "cluster.apptainer_gpu=nv",
    "--rocm": "cluster.apptainer_gpu=rocm",
}
# pyxis' srun flags slurmtrain sets -> the key that sets them.
PYXIS_OWNED = {
    "--container-image": "cluster.image=IMAGE",
    "--container-mounts": "cluster.container_binds=[SRC:DST] (the runs root is mounted already)",
}
PYXIS_PREFIXES = ("--container-", "--no-container-")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9_.+@%/=-]*$")
BIND_EXAMPLE = "e.g. cluster.container_binds=[/scratch,/opt/cray:/opt/cray:ro]"


class Bind(NamedTuple):
    src: str
    dst: str
    read_only: bool

    def spec(self) -> str:
        """SRC:DST[:ro], as apptainer's --bind and pyxis' --container-mounts both read it."""
        return f"{self.src}:{self.dst}" + (":ro" if self.read_only else "")


def parse_bind(text: str) -> Bind:
    """`SRC[:DST[:ro|rw]]` -> Bind, or one line naming the entry and the fix."""
    value = str(text)
    shown = f"cluster.container_binds entry {value!r}"
    if "$" in value or "`" in value or "~" in value:
        raise ConfigError(
            f"{shown}: binds are not expanded by a shell (they are quoted); write the path out, "
            f"or bind its parent ({BIND_EXAMPLE})"
        )
    parts = value.split(":")
    if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ConfigError(
            f"{shown}: not SRC[:DST[:ro]] (the third part is ro or rw); {BIND_EXAMPLE}"
        )
    src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
    for path in (src, dst):
        if not SAFE_PATH.match(path) or "//" in path:
            raise ConfigError(
                f"{shown}: {path!r} is not an absolute path of letters, digits and _.+@%/=- "
                f"(a comma would split it into two binds); {BIND_EXAMPLE}"
            )
    return Bind(src, dst, len(parts) == 3 and parts[2] == "ro")


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def is_pyxis_flag(arg: str) -> bool:
    return str(arg).startswith(PYXIS_PREFIXES)


def check_container(cfg: RootConfig) -> None:
    """Every container key's value, for every runtime (a site profile sets them before the
    container is chosen); the runtime-specific flags and image for the runtime chosen."""
    c = cfg.cluster
    for bind in c.container_binds:
        parse_bind(bind)
    _check_apptainer_keys(str(c.apptainer_binary), str(c.apptainer_gpu))
    kind = str(c.container)
    for arg in (str(a) for a in c.container_flags):
        _check_flag(kind, arg)
    if c.image:  # before the run directory is made: a missing image leaves nothing behind
        check_image_file(kind, str(c.image))
    if kind == "pyxis":
        for arg in (str(a) for a in c.srun_extra):
            if flag_name(arg) in PYXIS_OWNED:
                raise ConfigError(
                    f"cluster.srun_extra={arg!r}: slurmtrain sets {flag_name(arg)} itself; "
                    f"use {PYXIS_OWNED[flag_name(arg)]}"
                )


def _check_apptainer_keys(binary: str, gpu: str) -> None:
    base = binary.rsplit("/", 1)[-1]
    if not (binary in APPTAINER_NAMES or (SAFE_PATH.match(binary) and base)):
        raise ConfigError(
            f"cluster.apptainer_binary={binary!r}: use apptainer, singularity or an absolute "
            f"path to one; e.g. cluster.apptainer_binary=singularity"
        )
    if gpu not in APPTAINER_GPU:
        raise ConfigError(
            f"cluster.apptainer_gpu={gpu!r}: use nv (--nv, NVIDIA), rocm (--rocm, AMD) or none; "
            f"e.g. cluster.apptainer_gpu=rocm"
        )


def _check_flag(kind: str, arg: str) -> None:
    shown = f"cluster.container_flags entry {arg!r}"
    if not arg.startswith("-") or re.search(r"[\x00-\x1f\x7f]", arg):
        raise ConfigError(
            f"{shown}: a runtime flag starts with - (a value goes with it: --flag=VALUE) and "
            f"has no control characters; e.g. cluster.container_flags=[--cleanenv]"
        )
    if kind == "oci":
        raise ConfigError(
            f"{shown}: cluster.container=oci runs the bundle's config.json and takes no flags; "
            f"use cluster.container_binds for mounts, or edit the bundle"
        )
    if kind == "apptainer" and flag_name(arg) in APPTAINER_OWNED:
        raise ConfigError(
            f"{shown}: slurmtrain sets {flag_name(arg)} itself; use {APPTAINER_OWNED[flag_name(arg)]}"
        )
    if kind == "pyxis" and flag_name(arg) in PYXIS_OWNED:
        raise ConfigError(
            f"{shown}: slurmtrain sets {flag_name(arg)} itself; use {PYXIS_OWNED[flag_name(arg)]}"
        )
    if kind == "pyxis" and not is_pyxis_flag(arg):
        raise ConfigError(
            f"{shown}: not a pyxis flag (--container-* or --no-container-*); other srun flags "
            f"go in cluster.srun_extra"
        )


# The magic numbers read from an image's first bytes. SIF (sylabs/sif, pkg/sif): a 32-byte launch
# line "#!/usr/bin/env run-singularity", then "SIF_MAGIC". Squashfs (enroot's .sqsh, apptainer's
# older images): "hsqs" at 0. ext3 (apptainer's oldest writable images): 0xEF53 at 1080.
MAGICS = {"SIF": (32, b"SIF_MAGIC"), "squashfs": (0, b"hsqs"), "ext3": (1080, b"\x53\xef")}
# What each runtime takes as an image file; a URI (apptainer: docker://, library://, oras://,
# docker-archive:...; pyxis: anything not starting with / or ., its squashfs-path rule) is pulled
# on the node and cannot be checked here.
IMAGE_KINDS = {"apptainer": ("SIF", "squashfs", "ext3"), "pyxis": ("squashfs",)}
IMAGE_FIX = {
    "apptainer": "build one (apptainer build IMAGE.sif docker://...) or point cluster.image at a "
    ".sif file, a sandbox directory or a URI (docker://REPO:TAG)",
    "pyxis": "import one (enroot import -o IMAGE.sqsh docker://REPO:TAG) or point cluster.image at "
    "a .sqsh file or a registry image (nvcr.io#nvidia/pytorch:24.05-py3)",
}


def image_is_path(kind: str, image: str) -> bool:
    """Whether the runtime reads `image` as a file here (else it pulls a URI on the node)."""
    if kind == "pyxis":
        return image.startswith((".", "/"))  # pyxis: strspn(image, "./") > 0 is a squashfs path
    return not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", image)  # docker://, docker-archive:, ...


def _unmounted(path: Path) -> bool:
    """The path's top directory does not exist here: a filesystem only the compute nodes mount
    (a site profile's /fsx rendered on a laptop), which cannot be checked from this node."""
    parts = path.absolute().parts
    return len(parts) > 2 and not Path(parts[0], parts[1]).exists()


def check_image_file(kind: str, image: str) -> None:
    """cluster.image for apptainer or pyxis: a URI is accepted as is; a path must be a readable,
    non-empty image of the runtime's kind (an apptainer sandbox directory too), else one line
    naming the key, what is wrong and the fix (a missing .sif used to end as `config_error: exit
    code 2` on the node)."""
    if kind not in IMAGE_KINDS or not image_is_path(kind, image):
        return
    path, fix = Path(image), IMAGE_FIX[kind]
    shown = f"cluster.image={image}"
    try:
        st = path.stat()
    except OSError as exc:
        if _unmounted(path):
            return
        why = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"{shown}: {why} ({kind} image); {fix}") from None
    if kind == "apptainer" and stat.S_ISDIR(st.st_mode):  # a sandbox: its files are the image
        if not os.access(path, os.R_OK | os.X_OK):
            raise ConfigError(f"{shown}: a sandbox directory this user cannot read; {fix}")
        return
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{shown}: not a regular file ({kind} image); {fix}")
    try:
        with open(path, "rb") as f:
            head = f.read(1082)
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read it ({exc.strerror}); {fix}") from None
    if not head:
        raise ConfigError(f"{shown}: an empty file, not an image {kind} runs; {fix}")
    kinds = IMAGE_KINDS[kind]
    if not any(head[at : at + len(magic)] == magic for at, magic in (MAGICS[k] for k in kinds)):
        raise ConfigError(
            f"{shown}: not an image {kind} runs (no {' or '.join(kinds)} header in its first "
            f"bytes); "
            f"{fix}"
        )
