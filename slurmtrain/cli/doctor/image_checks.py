"""The container image itself, before anything is queued: python, torch, CUDA vs the host driver,
and the image's GLIBC against what its torch wheel needs.

An OCI bundle (cluster.container=oci) is read as files (its rootfs), so the check runs on a login
node without root or a runtime. An Apptainer image is probed with `apptainer exec`; a pyxis
image lives in a registry and is checked on a compute node (`doctor --srun`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

from slurmtrain.common.commands import run_cmd
from slurmtrain.common.errors import ConfigError
from slurmtrain.login import container

from .results import CheckResult

PROBE = (
    "import platform, torch; print(platform.python_version(), torch.__version__, "
    "torch.version.cuda, platform.libc_ver()[1])"
)


def _glibc(root: Path) -> Optional[tuple[int, int]]:
    """The newest GLIBC_2.N symbol version the image's C library defines."""
    for lib in sorted(root.glob("usr/lib*/*-linux-gnu/libc.so.6")) + sorted(
        root.glob("lib*/libc.so.6")
    ):
        found = re.findall(rb"GLIBC_2\.(\d+)", lib.read_bytes())
        if found:
            return (2, max(int(n) for n in found))
    return None


def _dist(root: Path, name: str) -> Optional[Path]:
    hits = sorted(
        p
        for site in ("usr/lib", "usr/local/lib", "opt/*/lib")
        for p in root.glob(f"{site}/python3*/*-packages/{name}-*.dist-info")
    )
    return hits[-1] if hits else None


def _driver_cuda(timeout: float) -> Optional[tuple[int, int]]:
    """The CUDA version the host's driver supports (nvidia-smi), or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    cmd = run_cmd(["nvidia-smi"], timeout)
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", cmd.out if cmd.ok else "")
    return (int(m[1]), int(m[2])) if m else None


def _version(text: Optional[str]) -> Optional[tuple[int, int]]:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2])) if m else None


def check_oci(image: str, timeout: float, runs_root: Optional[str] = None) -> CheckResult:
    try:
        spec = container.check_image_path(image)
    except ConfigError as err:
        return CheckResult("image", "fail", str(err), "fix cluster.image before submitting")
    root = container.rootfs(image, spec)
    torch = _dist(root, "torch")
    if torch is None:
        return CheckResult(
            "image", "fail", f"{image}: python3 but no torch", "install torch into the image"
        )
    bits = [f"torch {torch.name.removesuffix('.dist-info').split('-')[1]}"]
    need = (2, 17)  # manylinux2014 at least
    wheel = (torch / "WHEEL").read_text() if (torch / "WHEEL").exists() else ""
    tag = re.search(r"manylinux_(\d+)_(\d+)", wheel)
    if tag:
        need = (int(tag[1]), int(tag[2]))
    glibc = _glibc(root)
    bits.append(f"GLIBC {'.'.join(map(str, glibc)) if glibc else 'unknown'}")
    if glibc and glibc < need:
        return CheckResult(
            "image",
            "fail",
            "; ".join(bits) + f" < {need[0]}.{need[1]} that its torch wheel needs",
            "rebuild the image on a newer base (tools/build_image.sh uses Debian 12)",
        )
    version_py = root.joinpath(*torch.parent.relative_to(root).parts, "torch", "version.py")
    text = version_py.read_text() if version_py.exists() else ""
    m = re.search(r"^cuda\s*(?::.*)?=\s*['\"]?([\d.]+|None)", text, re.M)
    image_cuda = _version(m[1]) if m else None
    nccl = _dist(root, "nvidia_nccl_cu*")
    bits.append(f"CUDA {'.'.join(map(str, image_cuda)) if image_cuda else 'none (CPU build)'}")
    if nccl:
        bits.append(f"NCCL {nccl.name.removesuffix('.dist-info').split('-')[1]}")
    driver = _driver_cuda(timeout)
    if image_cuda and driver and image_cuda > driver:
        return CheckResult(
            "image",
            "fail",
            "; ".join(bits) + f"; host driver supports CUDA {driver[0]}.{driver[1]}",
            "use an image built for the driver's CUDA (or older), or update the driver",
        )
    if driver:
        bits.append(f"driver CUDA {driver[0]}.{driver[1]}")
    return CheckResult("image", "ok", "; ".join(bits))


def check_image(
    kind: str, image: Optional[str], timeout: float, runs_root: Optional[str] = None
) -> CheckResult:
    if kind == "none":
        return CheckResult("image", "ok", "no container")
    if not image:
        return CheckResult("image", "fail", "no image given", "pass --image (cluster.image)")
    if kind == "oci":
        return check_oci(image, timeout, runs_root)
    if kind == "apptainer" and shutil.which("apptainer"):
        cmd = run_cmd(["apptainer", "exec", image, "python", "-c", PROBE], max(timeout, 60))
        if not cmd.ok:
            return CheckResult("image", "fail", f"{image}: {cmd.reason()}", "the image needs torch")
        return CheckResult("image", "ok", f"python, torch, CUDA, GLIBC: {cmd.out.strip()}")
    return CheckResult(
        "image", "warn", f"{image}: not inspectable here", "doctor --srun checks it on a node"
    )
