"""NVIDIA device health from the driver: ECC, retired pages / remapped rows, throttling, XIDs.

A GPU with uncorrectable ECC errors, pages waiting for retirement, a failed row remap, a hardware
or thermal clock slowdown, or a hardware XID in the kernel log trains wrong or slow, or dies within
hours; the health gate's node lead fails such a node (`ecc: ...`, `xid: ...`) before the model
loads. One NVML pass a node (NVML sees every GPU of the node). No NVML library or no device: the
checks are skipped and say so. The decisions (`judge_device`, `xids`) are pure, for tests; NVML
(pynvml, nvidia-ml-py) is imported only when called, and never torch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

# nvmlClocksThrottleReason* bits that mean the hardware is slowing the clock (not power caps,
# idleness or application clocks, which a healthy node shows).
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THROTTLE_NAMES = {
    HW_SLOWDOWN: "hw_slowdown",
    SW_THERMAL: "sw_thermal",
    HW_THERMAL: "hw_thermal",
    HW_POWER_BRAKE: "hw_power_brake",
}
# XIDs that mean the hardware (not the program) failed (NVIDIA's XID catalogue): double-bit ECC,
# internal micro-controller halt, row-remap failure, NVLink error, fell off the bus, high
# single-bit ECC rate, uncontained ECC, GSP errors. XID 13/31/43 (a program's fault) pass.
HARDWARE_XIDS = {48: "DBE ECC", 62: "micro-controller halt", 64: "row remap failure",
                 74: "NVLink error", 79: "fell off the bus", 92: "high single-bit ECC rate",
                 94: "contained ECC", 95: "uncontained ECC", 119: "GSP timeout",
                 120: "GSP error"}  # fmt: skip
XID_LINE = re.compile(
    r"(?:\[\s*(\d+(?:\.\d+)?)\][^\n]*?)?NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),"
)
# Only recent XIDs judge a node: the kernel log holds everything since boot, and a GPU reset
# (nvidia-smi -r) cures the device without a reboot; an XID a day old is history, not health.
XID_RECENT_S = 24 * 3600.0


@dataclass
class DeviceState:
    """What NVML said about one device (None: the query is not supported there)."""

    index: int
    ecc_uncorrected: Optional[int] = None
    retired_pending: Optional[bool] = None
    remap_pending: Optional[bool] = None
    remap_failed: Optional[bool] = None
    throttle: Optional[int] = None


@dataclass
class GpuReport:
    """The node's verdict: `reason` empty when healthy; `note` says what was (not) checked."""

    ok: bool = True
    reason: str = ""
    note: str = ""
    devices: list[DeviceState] = field(default_factory=list)


def judge_device(d: DeviceState) -> Optional[str]:
    """The reason this device fails, or None."""
    if d.ecc_uncorrected:
        return f"ecc: GPU {d.index} has {d.ecc_uncorrected} uncorrectable ECC errors (volatile)"
    if d.retired_pending:
        return f"ecc: GPU {d.index} has retired pages pending (reset the GPU)"
    if d.remap_failed:
        return f"ecc: GPU {d.index} row remapping failed (replace the GPU)"
    if d.remap_pending:
        return f"ecc: GPU {d.index} has remapped rows pending (reset the GPU)"
    bits = [name for bit, name in THROTTLE_NAMES.items() if (d.throttle or 0) & bit]
    if bits:
        return f"throttle: GPU {d.index} clocks slowed by {'+'.join(bits)}"
    return None


def xids(kernel_log: str, uptime: Optional[float] = None) -> list[tuple[str, int]]:
    """(PCI address, XID) of every recent hardware XID in the kernel log's text: logged within
    XID_RECENT_S of `uptime` (seconds since boot; None: /proc/uptime). A line without dmesg's
    `[seconds]` stamp counts (its age is unknown: the cautious reading)."""
    now = _uptime() if uptime is None else uptime
    found = []
    for m in XID_LINE.finditer(kernel_log):
        stamp, pci, x = m.group(1), m.group(2), int(m.group(3))
        recent = stamp is None or now is None or now - float(stamp) <= XID_RECENT_S
        if x in HARDWARE_XIDS and recent:
            found.append((pci, x))
    return found


def _uptime() -> Optional[float]:
    try:
        return float(open("/proc/uptime").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kernel_log(timeout: float = 1.0) -> str:
    """`dmesg`'s text; empty where it is not readable (kernel.dmesg_restrict, no binary)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _query(nvml: Any, call: str, *args: Any) -> Any:
    """An NVML query, None where this device or driver does not support it."""
    try:
        return getattr(nvml, call)(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: that check is skipped
        return None


def read_device(nvml: Any, index: int) -> DeviceState:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    state = DeviceState(index)
    state.ecc_uncorrected = _query(
        nvml,
        "nvmlDeviceGetTotalEccErrors",
        h,
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
    )
    pending = _query(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    state.retired_pending = None if pending is None else bool(pending)
    remap = _query(
        nvml, "nvmlDeviceGetRemappedRows", h
    )  # (corrected, uncorrected, pending, failed)
    if remap is not None:
        state.remap_pending, state.remap_failed = bool(remap[2]), bool(remap[3])
    state.throttle = _query(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
    return state


def check(nvml: Any = None, log: Optional[str] = None) -> GpuReport:
    """Every device NVML can open, then the kernel log's XIDs (`log`: its text; None: read
    dmesg). `nvml`: pynvml, or a stand-in with its names (tests)."""
    if nvml is None:
        try:
            import pynvml  # type: ignore[import-untyped, unused-ignore]  # no hints
        except ImportError:
            return GpuReport(note="no NVIDIA device (pynvml not installed)")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - no library / no driver: nothing to check here
        return GpuReport(note=f"no NVIDIA device ({err})")
    try:
        count = nvml.nvmlDeviceGetCount()
        report = GpuReport(note=f"{count} NVIDIA device(s)" if count else "no NVIDIA device")
        for i in range(count):
            report.devices.append(_safe_read(nvml, i))
    finally:
        _query(nvml, "nvmlShutdown")
    return _verdict(report, kernel_log() if log is None and report.devices else log or "")


def _safe_read(nvml: Any, index: int) -> DeviceState:
    try:
        return read_device(nvml, index)
    except Exception:  # noqa: BLE001 - a device this job may not open (cgroups): not judged
        return DeviceState(index)


def _verdict(report: GpuReport, log: str) -> GpuReport:
    for d in report.devices:
        why = judge_device(d)
        if why:
            report.ok, report.reason = False, why
            return report
    found = xids(log)
    if found:
        pci, x = found[-1]
        report.ok, report.reason = False, f"xid: {x} ({HARDWARE_XIDS[x]}) on PCI {pci}"
        report.note += f"; {len(found)} hardware XID(s) in the kernel log"
    elif report.devices:
        report.note += "; no hardware XID in the kernel log" if log else "; kernel log unreadable"
    return report
