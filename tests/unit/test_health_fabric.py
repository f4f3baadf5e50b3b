"""The health gate judges link bandwidth against the floor of the fabric it finds (pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slurmtrain.compute.faults import fabric, health
from slurmtrain.compute.faults.health import RankHealth

NVLINK, IB = fabric.Fabric("NVLink", 80.0), fabric.Fabric("InfiniBand", 8.0)
GPU = torch.device("cuda", 0)


def _node(name: str, first: int, intra: float, pairs: dict[str, float]) -> list[RankHealth]:
    ranks = []
    for rank in range(first, first + 8):
        h = RankHealth(
            name, rank, True, "", 0.01, 0.002, 300.0, 79.0, intra, intra=NVLINK, inter=IB
        )
        h.pair_gbps = dict(pairs) if rank == first else {}  # one rank a node times the pair
        ranks.append(h)
    return ranks


def test_a_node_whose_gpus_fall_back_to_shared_memory_fails_naming_the_fabric():
    everyone = [
        *_node("n1", 0, 360.0, {"n2": 40.0}),
        *_node("n2", 8, 14.0, {"n1": 40.0}),  # --gpus-per-task: NCCL over shared memory
    ]
    verdict = health.judge(everyone, slow_factor=5.0)
    [bad] = verdict.bad
    assert bad["node"] == "n2"
    assert "intra-node fabric" in bad["reason"] and "NVLink" in bad["reason"]
    assert "14.0 GB/s" in bad["reason"] and "80 GB/s floor" in bad["reason"]
    assert verdict.figures == {
        "allreduce_gbps": 300.0,
        "fabric": "NVLink / InfiniBand",
        "intra_node_gbps": 14.0,
        "inter_node_gbps": 40.0,
    }


def test_a_node_pair_below_the_inter_node_floor_fails_both_and_healthy_pairs_pass():
    everyone = [
        *_node("n1", 0, 360.0, {"n2": 1.5}),  # InfiniBand down: NCCL on TCP sockets
        *_node("n2", 8, 360.0, {"n1": 1.5}),
        *_node("n3", 16, 360.0, {"n4": 42.0}),
        *_node("n4", 24, 360.0, {"n3": 42.0}),
    ]
    bad = health.judge(everyone, slow_factor=5.0).bad
    assert sorted(b["node"] for b in bad) == ["n1", "n2"]
    assert all("InfiniBand" in b["reason"] and "1.5 GB/s" in b["reason"] for b in bad)
    # timed twice (odd node count): slow only when every pair it was in is slow
    one_bad_pair = _node("n1", 0, 360.0, {"n2": 1.5, "n3": 40.0})
    assert health.judge(one_bad_pair, slow_factor=5.0).bad == []


def test_cpu_runs_and_unmeasured_links_are_not_judged():
    cpu = fabric.Fabric("gloo (CPU)", 0.0)
    h = RankHealth("n1", 0, True, "", 0.01, 0.1, 0.05, -1.0, 0.01, {"n2": 0.01}, cpu, cpu)
    assert health.judge([h], slow_factor=5.0).bad == []
    assert not fabric.below(0.0, NVLINK)  # 0: alone on its node, nothing was timed


def test_node_pairs_cover_every_node_with_an_odd_count_pairing_the_last_with_the_first():
    assert health._pair_rounds([0]) == [[]]
    assert health._pair_rounds([0, 8, 16, 24]) == [[(0, 8), (16, 24)]]
    assert health._pair_rounds([0, 8, 16]) == [[(0, 8)], [(16, 0)]]


def _port(root: Path, device: str, state: str) -> None:
    port = root / device / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(state)


def test_the_inter_node_fabric_is_an_active_rdma_port_unless_nccl_is_told_otherwise(tmp_path):
    _port(tmp_path, "mlx5_0", "1: DOWN\n")
    assert fabric.inter_node(GPU, {}, tmp_path).name == "TCP sockets"
    _port(tmp_path, "mlx5_1", "4: ACTIVE\n")
    assert fabric.inter_node(GPU, {}, tmp_path) == IB
    assert fabric.inter_node(GPU, {"NCCL_IB_DISABLE": "1"}, tmp_path).name == "TCP sockets"
    assert fabric.inter_node(GPU, {"NCCL_NET": "Socket"}, tmp_path).name == "TCP sockets"
    efa = tmp_path / "aws"
    _port(efa, "efa_0", "4: ACTIVE\n")
    assert fabric.inter_node(GPU, {}, efa).name == "EFA"
    assert fabric.inter_node(GPU, {}, tmp_path / "none").name == "TCP sockets"
    assert not fabric.inter_node(torch.device("cpu"), {}, tmp_path).judged()


@pytest.mark.parametrize(
    "card, expected",
    [
        ("NVIDIA H100 80GB HBM3", "NVLink"),
        ("NVIDIA H200", "NVLink"),
        ("NVIDIA A100-SXM4-80GB", "NVLink"),
        ("NVIDIA H100 PCIe", "PCIe"),
        ("NVIDIA A100 80GB PCIe", "PCIe"),
        ("NVIDIA L40S", "PCIe"),
    ],
)
def test_without_nvml_the_intra_node_fabric_follows_the_cards_name(monkeypatch, card, expected):
    monkeypatch.setattr(fabric, "_nvlink_active", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    assert fabric.intra_node(GPU).name == expected
