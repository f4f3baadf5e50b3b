"""Which fabric the health gate's all-reduces cross, and the bus bandwidth below which it is broken.

A slow fabric fails no matmul: where a site hides a node's GPUs from each other (cgroups with
`--gpus-per-task`), NCCL falls back from NVLink/CUDA IPC to shared memory, 10-20x slower; where
InfiniBand is down or not found, NCCL falls back to TCP sockets. Each measurement is judged against
the floor of the fabric the node should be using, so the slow path is failed with its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch

# Bus bandwidth (nccl-tests' busbw) of a 256 MiB all-reduce below which a fabric is failed, in GB/s:
# a quarter or less of what a healthy link gives, several times what its fallback gives. NVLink:
# H100/H200 NVLink 4 ~360-480, A100 NVLink 3 ~230 on 8 GPUs; NCCL's shared-memory fallback ~10-20.
# PCIe Gen4/5 peer-to-peer ~15-40 (its fallback, through host memory, ~5). InfiniBand or EFA: one
# 200-400 Gb/s NIC gives ~20-45 per node pair; TCP sockets ~1-3. A CPU (gloo) run is not judged.
FLOORS_GBPS = {
    "NVLink": 80.0,
    "PCIe": 4.0,
    "InfiniBand": 8.0,
    "EFA": 8.0,
    "TCP sockets": 0.0,
    "gloo (CPU)": 0.0,
}
# Cards whose 8-GPU boards are NVLink (SXM / HGX); their PCIe editions say "PCIe" in the name.
_NVLINK_CARDS = ("SXM", "HBM3", "H200", "H800", "H20", "B200", "B100", "GB200", "GH200")


@dataclass(frozen=True)
class Fabric:
    name: str
    floor_gbps: float

    def judged(self) -> bool:
        return self.floor_gbps > 0


def _fabric(name: str) -> Fabric:
    return Fabric(name, FLOORS_GBPS[name])


def _nvlink_active(device: torch.device) -> Optional[bool]:
    """NVML's answer (some link of this GPU is up), or None where NVML is not at hand."""
    try:
        import pynvml  # type: ignore[import-untyped, unused-ignore]  # no hints

        pynvml.nvmlInit()
        props = torch.cuda.get_device_properties(device)
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus.encode())
        links = range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))
        for link in links:
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    return True
            except pynvml.NVMLError:
                break  # past this GPU's last link
        return False
    except Exception:  # noqa: BLE001  no NVML, no such call on this driver: judge by the name
        return None


def intra_node(device: torch.device) -> Fabric:
    """The fabric between the GPUs of one node: what the board has, not what NCCL found."""
    if device.type != "cuda":
        return _fabric("gloo (CPU)")
    nvlink = _nvlink_active(device)
    if nvlink is None:
        name = torch.cuda.get_device_name(device)
        nvlink = "PCIE" not in name.upper() and any(card in name for card in _NVLINK_CARDS)
    return _fabric("NVLink" if nvlink else "PCIe")


def inter_node(
    device: torch.device, env: Mapping[str, str], sysfs: Path = Path("/sys/class/infiniband")
) -> Fabric:
    """The fabric between nodes: an RDMA device with an active port, unless NCCL is told not to
    use it (NCCL_IB_DISABLE=1, NCCL_NET=Socket)."""
    if device.type != "cuda":
        return _fabric("gloo (CPU)")
    if env.get("NCCL_IB_DISABLE") == "1" or env.get("NCCL_NET", "").lower() == "socket":
        return _fabric("TCP sockets")
    try:
        devices = sorted(sysfs.iterdir())
    except OSError:
        devices = []
    for rdma in devices:
        try:
            states = [p.read_text() for p in rdma.glob("ports/*/state")]
        except OSError:
            continue
        if any("ACTIVE" in state for state in states):
            return _fabric("EFA" if rdma.name.startswith("efa") else "InfiniBand")
    return _fabric("TCP sockets")


def below(gbps: float, fabric: Fabric) -> bool:
    return fabric.judged() and 0 < gbps < fabric.floor_gbps


def why_slow(gbps: float, fabric: Fabric, between: str) -> str:
    hint = {
        "NVLink": " (GPUs hidden from each other, e.g. by --gpus-per-task? NCCL then uses shared memory)",
        "InfiniBand": " (NCCL on TCP sockets? check NCCL_IB_HCA / NCCL_SOCKET_IFNAME)",
    }.get(fabric.name, "")
    return (
        f"slow {between}: all-reduce bus bandwidth {gbps:.1f} GB/s, below the "
        f"{fabric.floor_gbps:g} GB/s floor of {fabric.name}{hint}"
    )
