"""The plan's card (issue 32, Why 7): GPU memory in the units the card reports, cluster.gpu_type from
the partition's GRES, and the ETA's MFU from a table, a GPU check's measurement or the user."""

from __future__ import annotations

import json

import pytest

from slurmtrain.common import schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.slurm_text import parse_partitions
from slurmtrain.login import placement
from slurmtrain.login.composed import typed
from slurmtrain.planning import cards, mfu, preflight
from tests.plans import composed, plan_line, planned

HEADLINE = ["model=opt13b", "nodes=64", "gpus_per_node=8", "cluster=local", "dry_run=true"]
# opt2.7b on one GPU at micro batch 4: 80.0 GiB/GPU (bench/gpu_check.py runs micro batch 2)
CHECK = ["model=opt2.7b", "nodes=1", "gpus_per_node=1", "cluster=local", "deepspeed=zero2"]
CHECK += ["train.micro_batch_size=4", "train.global_batch_size=4", "dry_run=true"]


pytestmark = pytest.mark.usefixtures("no_slurm")


# ---- GPU memory: GiB as the card reports it --------------------------------------------------


def test_an_h100_is_planned_with_the_memory_pytorch_reports_not_80_gib(tmp_path):
    cfg = planned(tmp_path, *CHECK)
    card = cards.card(cfg)
    assert card.mem_gib == pytest.approx(79.1) and card.assumed
    report = preflight.report(cfg)
    assert report.misfit and "> 79.1 GiB (H100-SXM 80GB as PyTorch reports it" in report.misfit
    assert "cluster.gpu_type=auto: an H100 assumed" in report.misfit


def test_the_measured_memory_set_by_the_gpu_check_wins_and_is_named(tmp_path):
    for measured in ("79.19", "139.81"):  # mem_get_info totals / 2**30 of an H100 and an H200
        cfg = planned(tmp_path, *CHECK, f"cluster.gpu_mem_gb={measured}")
        report = preflight.report(cfg)
        line = plan_line(report, "plan: memory/GPU")
        assert f"({cards.card(cfg).mem_source})" in line
        assert f"cluster.gpu_mem_gb={float(measured):g}" in line
    assert report.misfit is None  # opt2.7b micro batch 4 fits an H200


@pytest.mark.parametrize(
    "name,gib,key",
    [
        ("h200", 139.8, "H200"),
        ("nvidia_h100_80gb_hbm3", 79.1, "H100-SXM"),
        ("a100-sxm4-80gb", 79.1, "A100"),
        ("a100", 39.4, "A100"),  # no size in the name: the smaller part
        ("NVIDIA H200", 139.8, "H200"),
    ],
)
def test_gres_and_device_names_give_the_card_and_its_memory(tmp_path, name, gib, key):
    cfg = planned(tmp_path, *CHECK, f"cluster.gpu_type={name}")
    card = cards.card(cfg)
    assert (card.key, round(card.mem_gib, 1), card.assumed) == (key, gib, False)


def test_a_card_without_a_memory_figure_is_refused_in_one_line(tmp_path):
    cfg = planned(tmp_path, *CHECK, "cluster.gpu_type=l40s")
    with pytest.raises(ConfigError) as err:
        preflight.report(cfg)
    text = str(err.value)
    assert "\n" not in text and "cluster.gpu_type='l40s'" in text and "cluster.gpu_mem_gb=" in text


# ---- cluster.gpu_type from the partition's GRES ----------------------------------------------

TYPED = (
    "PartitionName=gpu Nodes=g[1-2] TotalNodes=2 TotalCPUs=64 State=UP MaxTime=2-00:00:00 "
    "Default=YES TRES=cpu=64,mem=1000G,node=2,billing=64,gres/gpu=16,gres/gpu:h200=16\n"
    "PartitionName=plain Nodes=p[1-2] TotalNodes=2 TotalCPUs=64 State=UP MaxTime=UNLIMITED "
    "TRES=cpu=64,mem=1000G,node=2,gres/gpu=16\n"
    "PartitionName=mixed Nodes=m[1-2] TotalNodes=2 TotalCPUs=64 State=UP MaxTime=UNLIMITED "
    "TRES=cpu=64,node=2,gres/gpu=16,gres/gpu:a100=8,gres/gpu:h100=8\n"
)


def test_the_gres_type_is_parsed_from_scontrols_tres():
    parts = parse_partitions(TYPED)
    assert parts["gpu"].gpu_type == "h200" and parts["gpu"].gpus_per_node == 8
    assert parts["plain"].gpu_type is None  # count-only GRES names no card
    assert parts["mixed"].gpu_type is None  # two cards: no one card to plan for


def _on_slurm(tmp_path, monkeypatch, *overrides: str) -> schema.RootConfig:
    monkeypatch.setenv("SLURMTRAIN_AUTO", "")
    placement._probe_cache["slurm"] = placement.Probe(parse_partitions(TYPED), "test")
    return typed(composed(tmp_path, "cluster=slurm", "gpus_per_node=8", *overrides))


def test_gpu_type_auto_takes_the_partitions_gres_and_an_explicit_one_wins(tmp_path, monkeypatch):
    cfg = _on_slurm(tmp_path, monkeypatch, "cluster.partition=gpu")
    placement.resolve_auto(cfg)
    assert cfg.cluster.gpu_type == "h200" and cards.card(cfg).mem_gib == pytest.approx(139.8)
    cfg = _on_slurm(tmp_path, monkeypatch, "cluster.partition=gpu", "cluster.gpu_type=a100")
    placement.resolve_auto(cfg)
    assert cfg.cluster.gpu_type == "a100"
    cfg = _on_slurm(tmp_path, monkeypatch, "cluster.partition=plain")
    placement.resolve_auto(cfg)
    assert cfg.cluster.gpu_type == "auto" and cards.card(cfg).assumed


# ---- the ETA's MFU ---------------------------------------------------------------------------


def test_the_plan_prints_one_mfu_line_labelled_an_estimate_with_its_source(tmp_path):
    report = preflight.report(planned(tmp_path, *HEADLINE))
    line = plan_line(report, "plan: MFU")
    assert line.startswith(
        "plan: MFU 40% (estimate from the table: H100-SXM, ZeRO-0-2, 10-30B, TP=1"
    )
    assert "MosaicML" in line and "above 30B" not in line
    assert "MFU 40%, an estimate" in plan_line(report, "plan: ETA")


def test_the_table_is_keyed_by_card_stage_band_and_tp():
    assert mfu.table("H100-SXM", 2, 13e9)[0] == 0.40
    assert mfu.table("H200", 3, 13e9)[0] == pytest.approx(0.35)  # ZeRO-3 below ZeRO-2
    assert mfu.table("A100", 2, 13e9)[0] > mfu.table("H100-SXM", 2, 13e9)[0]  # lower peak
    assert mfu.table("H100-SXM", 2, 66e9)[0] < mfu.table("H100-SXM", 2, 13e9)[0]
    assert mfu.table("L40S", 2, 1e9)[1].startswith("L40S, ZeRO-0-2, <3B, TP=1: no published")
    assert "TP=1" in mfu.table("H100-SXM", 2, 1e9, tp=1)[1]


def test_above_30b_without_tensor_parallelism_the_plan_says_what_it_expects_and_why(tmp_path):
    cfg = planned(
        tmp_path, *HEADLINE, "model=opt66b", "deepspeed=zero3", "train.micro_batch_size=1"
    )
    line = plan_line(preflight.report(cfg), "plan: MFU")
    assert line.startswith("plan: MFU 25% (estimate from the table: H100-SXM, ZeRO-3, >30B")
    assert "above 30B without tensor parallelism expect less" in line and "all-gathers" in line


def test_the_gpu_checks_measurement_replaces_the_table_for_its_key(tmp_path):
    rows = [
        {"check": "device", "name": "NVIDIA H100 80GB HBM3"},
        {"check": "throughput", "model": "opt2.7b", "ours": {"mfu": 0.47}, "ok": True},
        {"check": "slice13b", "model": "opt13b", "mfu": 0.52, "ok": True},
    ]
    path = tmp_path / "gpu_check.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = planned(tmp_path, *HEADLINE, f"mfu_measured={path}")
    line = plan_line(preflight.report(cfg), "plan: MFU")
    assert line.startswith("plan: MFU 52% (estimate, measured by bench/gpu_check.py: slice13b")
    zero3 = planned(tmp_path, *HEADLINE, f"mfu_measured={path}", "deepspeed=zero3")
    assert "from the table" in plan_line(
        preflight.report(zero3), "plan: MFU"
    )  # measured ZeRO-2 only
    hand = planned(tmp_path, *HEADLINE, f"mfu_measured={path}", "mfu_guess=0.3")
    assert plan_line(preflight.report(hand), "plan: MFU").startswith(
        "plan: MFU 30% (estimate, set by hand: mfu_guess=0.3)"
    )


@pytest.mark.parametrize("value", ["1.5", "0"])
def test_a_bad_mfu_guess_is_refused_in_one_line(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        preflight.report(planned(tmp_path, *HEADLINE, f"mfu_guess={value}"))
    assert f"mfu_guess={value}" in str(err.value) and "\n" not in str(err.value)
