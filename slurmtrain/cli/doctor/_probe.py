"""Run as a separate process by the doctor: import torch and DeepSpeed and print what they report.

A child process keeps the doctor itself light (torch + DeepSpeed cost ~2-3 s to import) and lets it give
up on an import that hangs (a stale NFS mount, a CUDA driver probe) instead of hanging with it.
Depends on nothing from slurmtrain so it runs by file path. The last stdout line is the JSON result.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import time
from types import ModuleType
from typing import Optional, TypedDict

MARKER = "@@doctor-probe@@"


class OpStatus(TypedDict):
    compatible: bool
    installed: bool


class ProbeReport(TypedDict, total=False):
    """The probe's JSON: versions and findings, or `<part>_error` where a part failed."""

    python: str
    probe_error: str  # set by the doctor when the probe gave no report
    torch: str
    torch_error: str
    torch_import_s: float
    torch_cuda: Optional[str]
    torch_hip: Optional[str]
    gloo: bool
    nccl_backend: bool
    dist_error: str
    cuda_available: bool
    cuda_error: str
    device_count: int
    devices: list[str]
    capabilities: list[str]
    nccl: str
    nccl_error: str
    deepspeed: str
    deepspeed_error: str
    deepspeed_import_s: float
    ds_torch_info: dict[str, str]
    ds_accelerator: str
    ds_ops: dict[str, OpStatus]
    ninja: bool
    ninja_error: str


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:300]


def probe_torch(out: ProbeReport) -> Optional[ModuleType]:
    start = time.monotonic()
    try:
        import torch
    except BaseException as exc:  # an ImportError, or an OSError from a missing libcudart
        out["torch_error"] = _err(exc)
        return None
    out["torch_import_s"] = round(time.monotonic() - start, 2)
    out["torch"] = torch.__version__
    out["torch_cuda"] = getattr(torch.version, "cuda", None)
    out["torch_hip"] = getattr(torch.version, "hip", None)
    try:
        import torch.distributed as dist

        out["gloo"] = bool(dist.is_available() and dist.is_gloo_available())
        out["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
    except BaseException as exc:
        out["dist_error"] = _err(exc)
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if out["cuda_available"] else 0
        out["device_count"] = count
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(count)]
        out["capabilities"] = [
            ".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(count)
        ]
    except BaseException as exc:
        out["cuda_error"] = _err(exc)
    if out.get("cuda_available"):
        try:
            ver = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, ver)) if isinstance(ver, tuple) else str(ver)
        except BaseException as exc:
            out["nccl_error"] = _err(exc)
    module: ModuleType = torch  # torch is not followed by the type checker
    return module


def probe_deepspeed(out: ProbeReport) -> None:
    if importlib.util.find_spec("deepspeed") is None:
        out["deepspeed_error"] = "not installed"
        return
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed
            from deepspeed.accelerator import get_accelerator
            from deepspeed.git_version_info import installed_ops, torch_info
            from deepspeed.ops.op_builder.all_ops import ALL_OPS
    except BaseException as exc:
        out["deepspeed_error"] = _err(exc)
        return
    out["deepspeed_import_s"] = round(time.monotonic() - start, 2)
    out["deepspeed"] = deepspeed.__version__
    out["ds_torch_info"] = {k: str(v) for k, v in dict(torch_info).items()}
    ops: dict[str, OpStatus] = {}
    with contextlib.redirect_stdout(sys.stderr):
        try:
            out["ds_accelerator"] = get_accelerator()._name
        except BaseException as exc:
            out["ds_accelerator"] = f"error: {_err(exc)}"
        for name, builder in ALL_OPS.items():  # what deepspeed/env_report.py's op_report does
            try:
                compatible = bool(builder.is_compatible(False))
            except BaseException:
                compatible = False
            ops[name] = {
                "compatible": compatible,
                "installed": bool(installed_ops.get(name, False)),
            }
        try:
            from torch.utils.cpp_extension import is_ninja_available

            out["ninja"] = bool(is_ninja_available())
        except BaseException as exc:
            out["ninja_error"] = _err(exc)
    out["ds_ops"] = ops


def main() -> None:
    out: ProbeReport = {"python": sys.version.split()[0]}
    if probe_torch(out) is not None:
        probe_deepspeed(out)
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
