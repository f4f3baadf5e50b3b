"""Container settings checked on the login node (issue 35, build 5): cluster.container_binds,
cluster.container_flags, cluster.apptainer_binary, cluster.apptainer_gpu, and the pyxis flags that
slurmtrain owns in cluster.srun_extra.

Each failure is one ConfigError line naming the key, the value and the fix. Values that pass reach
the batch script through shlex.quote (login/container.py), never unquoted; what is refused here is
what would mean something else than it says: a `$VAR` that would stay literal, a comma that splits
one bind into two, a flag that replaces one slurmtrain sets.
"""

from __future__ import annotations

import re
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
    container is chosen); the runtime-specific flags for the runtime chosen."""
    c = cfg.cluster
    for bind in c.container_binds:
        parse_bind(bind)
    _check_apptainer_keys(str(c.apptainer_binary), str(c.apptainer_gpu))
    kind = str(c.container)
    for arg in (str(a) for a in c.container_flags):
        _check_flag(kind, arg)
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
