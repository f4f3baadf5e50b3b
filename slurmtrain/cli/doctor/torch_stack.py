"""torch / CUDA / NCCL / DeepSpeed checks, from one probe subprocess (see _probe.py for why a child)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slurmtrain.cli.doctor._probe import MARKER, OpStatus, ProbeReport
from slurmtrain.cli.doctor.results import CheckResult, on_compute_node
from slurmtrain.common.commands import run_cmd

PROBE = Path(__file__).with_name("_probe.py")
NAMES = ("torch", "cuda", "nccl", "deepspeed", "deepspeed_ops")
# Ops whose missing system dependency is routine and only matters for one feature.
OP_HINTS = {
    "async_io": "needs libaio (apt install libaio-dev) only for NVMe offload",
    "deepspeed_ccl_comm": "needs oneCCL only for Intel CCL",
    "evoformer_attn": "needs CUTLASS",
    "gds": "needs NVIDIA GPUDirect Storage",
}


def run_probe(timeout: float) -> ProbeReport:
    """The probe's JSON, or {'probe_error': why}; never raises."""
    cmd = run_cmd(
        [sys.executable, str(PROBE)],
        timeout=timeout,
        env={"PYTHONWARNINGS": "ignore", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    for line in reversed(cmd.out.splitlines()):
        if line.startswith(MARKER):
            try:
                report: ProbeReport = json.loads(line[len(MARKER) :])
                return report
            except ValueError:
                break
    if cmd.rc == 124:
        return {"probe_error": f"importing torch/deepspeed took longer than {timeout:g} s"}
    return {"probe_error": f"probe exited {cmd.rc}: {cmd.reason()}"}


def nvidia_driver() -> str | None:
    """The kernel driver line when an NVIDIA driver is loaded (GPU machine), else None."""
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return " ".join(first.split()[:8])


def _torch(p: ProbeReport) -> CheckResult:
    if "torch_error" in p:
        return CheckResult(
            "torch",
            "fail",
            p["torch_error"],
            "install torch into this venv (the same wheel "
            "on login and compute nodes); see the glibc check for loader errors",
        )
    build = (
        f"CUDA {p['torch_cuda']}"
        if p.get("torch_cuda")
        else f"ROCm {p['torch_hip']}"
        if p.get("torch_hip")
        else "CPU-only build"
    )
    return CheckResult(
        "torch", "ok", f"{p['torch']} ({build}; import {p.get('torch_import_s', '?')} s)"
    )


def _cuda(p: ProbeReport, driver: str | None, compute: bool) -> CheckResult:
    if "torch_error" in p:
        return CheckResult("cuda", "fail", "torch not importable", "fix the torch check first")
    if "cuda_error" in p:
        return CheckResult(
            "cuda",
            "fail",
            p["cuda_error"],
            "torch.cuda failed: check the driver (nvidia-smi) against torch.version.cuda",
        )
    gpu_build = bool(p.get("torch_cuda") or p.get("torch_hip"))
    if p.get("cuda_available"):
        names = p.get("devices") or []
        caps = p.get("capabilities") or []
        kinds = sorted(set(names))
        value = (
            f"{p.get('device_count', 0)} x {', '.join(kinds)} (cc {', '.join(sorted(set(caps)))})"
        )
        if len(kinds) > 1:
            return CheckResult(
                "cuda",
                "warn",
                value,
                "mixed GPU models: the slowest sets the pace; "
                "request one type with --gres=gpu:<type>:N",
            )
        return CheckResult("cuda", "ok", value)
    if not gpu_build:
        if driver:
            return CheckResult(
                "cuda",
                "fail",
                f"CPU-only torch, but {driver}",
                "install the CUDA wheel of torch (e.g. --index-url .../whl/cu12x)",
            )
        return CheckResult(
            "cuda", "ok", "no GPU, CPU-only torch (DeepSpeed: DS_ACCELERATOR=cpu, gloo)"
        )
    if driver:
        return CheckResult(
            "cuda",
            "fail",
            f"CUDA {p['torch_cuda']} build sees no GPU; {driver}",
            "driver older than the CUDA runtime, or CUDA_VISIBLE_DEVICES empty: compare "
            "nvidia-smi's CUDA version with torch.version.cuda",
        )
    if compute:
        return CheckResult(
            "cuda",
            "fail",
            "no GPU visible inside the job",
            "request GPUs (--gpus-per-node / --gres=gpu:N) or use a GPU partition",
        )
    return CheckResult(
        "cuda",
        "ok",
        "no GPU visible (normal on a login node)",
        "use --srun to check the compute nodes' GPUs",
    )


def _nccl(p: ProbeReport) -> CheckResult:
    if "torch_error" in p:
        return CheckResult("nccl", "fail", "torch not importable", "fix the torch check first")
    env = ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_"))
    suffix = f"; {env}" if env else ""
    if p.get("cuda_available"):
        if p.get("nccl"):
            return CheckResult("nccl", "ok", f"NCCL {p['nccl']}{suffix}")
        return CheckResult(
            "nccl",
            "fail",
            p.get("nccl_error", "torch.cuda.nccl.version() failed"),
            "torch's bundled NCCL is broken or shadowed: check LD_LIBRARY_PATH for another libnccl",
        )
    if p.get("gloo"):
        return CheckResult("nccl", "ok", f"n/a without CUDA; gloo backend available{suffix}")
    return CheckResult(
        "nccl",
        "fail",
        "neither NCCL (no CUDA) nor gloo available",
        p.get("dist_error", "this torch build has no torch.distributed backend"),
    )


def _deepspeed(p: ProbeReport) -> CheckResult:
    if "torch_error" in p:
        return CheckResult("deepspeed", "fail", "torch not importable", "fix the torch check first")
    if "deepspeed_error" in p:
        return CheckResult(
            "deepspeed",
            "fail",
            p["deepspeed_error"],
            "install deepspeed into this venv (DS_BUILD_OPS=0 for a JIT-only install)",
        )
    accel = p.get("ds_accelerator", "?")
    env_accel = os.environ.get("DS_ACCELERATOR")
    info = p.get("ds_torch_info") or {}
    built = info.get("version", "0.0")
    value = (
        f"{p['deepspeed']} (accelerator {accel}{'' if env_accel else ', auto-detected'}; "
        f"ops built for torch {built if built != '0.0' else '-'})"
    )
    if (
        built != "0.0"
        and built.split(".")[:2] != str(p.get("torch", "")).split("+")[0].split(".")[:2]
    ):
        return CheckResult(
            "deepspeed",
            "warn",
            value,
            f"DeepSpeed's prebuilt ops were compiled for torch "
            f"{built}, not {p.get('torch')}: reinstall deepspeed against this torch",
        )
    if accel == "cpu" and p.get("cuda_available"):
        return CheckResult(
            "deepspeed",
            "warn",
            value,
            "GPUs present but DeepSpeed uses the CPU accelerator: unset DS_ACCELERATOR=cpu",
        )
    return CheckResult("deepspeed", "ok", value)


def _ops(p: ProbeReport) -> CheckResult:
    if "torch_error" in p or "deepspeed_error" in p or "ds_ops" not in p:
        return CheckResult("deepspeed_ops", "fail", "no op report", "fix the deepspeed check first")
    ops: dict[str, OpStatus] = p["ds_ops"]
    bad = sorted(n for n, o in ops.items() if not o.get("compatible"))
    prebuilt = sorted(n for n, o in ops.items() if o.get("installed"))
    ninja = p.get("ninja")
    value = (
        f"{len(ops) - len(bad)}/{len(ops)} compatible"
        + (f"; not: {', '.join(bad)}" if bad else "")
        + f"; prebuilt: {', '.join(prebuilt) if prebuilt else 'none (JIT)'}; ninja {'yes' if ninja else 'no'}"
    )
    if not ninja and len(prebuilt) < len(ops):
        return CheckResult(
            "deepspeed_ops",
            "warn",
            value,
            "ninja missing: JIT op builds fail; install ninja "
            "into the venv, or use torch optimizers (torch_adam) only",
        )
    hints = "; ".join(f"{n} {OP_HINTS[n]}" for n in bad if n in OP_HINTS)
    others = [n for n in bad if n not in OP_HINTS]
    if others:
        return CheckResult(
            "deepspeed_ops",
            "warn",
            value,
            f"{', '.join(others)} cannot be built here "
            "(ds_report shows why); fine unless the config uses them"
            + (f"; {hints}" if hints else ""),
        )
    if bad:
        return CheckResult("deepspeed_ops", "ok", value, hints)
    return CheckResult("deepspeed_ops", "ok", value)


def evaluate_probe(
    p: ProbeReport, driver: str | None = None, compute: bool = False
) -> list[CheckResult]:
    """The five results from one probe result (pure: tests can feed it a dict)."""
    if "probe_error" in p:
        why = p["probe_error"]
        first = CheckResult(
            "torch",
            "fail",
            why,
            "torch could not be imported in time: check the filesystem "
            "holding the venv (slow NFS?) and LD_LIBRARY_PATH",
        )
        return [first] + [
            CheckResult(n, "fail", "not checked", "fix the torch check first") for n in NAMES[1:]
        ]
    return [_torch(p), _cuda(p, driver, compute), _nccl(p), _deepspeed(p), _ops(p)]


def torch_checks(timeout: float) -> list[CheckResult]:
    return evaluate_probe(run_probe(timeout), nvidia_driver(), on_compute_node())
