"""Tensor parallelism at login (issue 33, builds 5 and 7): parallel.tensor's checks, DP = world / TP
in the batch arithmetic and the ds config, and the three plans at scale with their numbers: opt66b
and a Llama-3-70B-shaped model on 64 x 8 H100s with TP 8 fit and name TP, DP, the communication per
step and the MFU estimate; a BLOOM-176B-shaped run on 48 x 8 with global batch 2048 is refused with
the nearest global batches that divide and what would fit instead."""

from __future__ import annotations

import pytest

from slurmtrain.common import ds_config, rundir
from slurmtrain.common.derived import data_parallel, grad_accumulation
from slurmtrain.common.errors import ConfigError
from slurmtrain.login.composed import typed
from slurmtrain.planning import memory, mfu, parallel_plan, preflight
from tests.plans import GiB, plan_line, planned

H100 = ["nodes=64", "gpus_per_node=8", "cluster=local", "dry_run=true", "parallel.tensor=8"]
LLAMA70 = [
    "model=llama3_8b",
    "model.name=llama3_70b",
    "model.hidden_size=8192",
    "model.num_layers=80",
    "model.num_heads=64",
    "model.num_kv_heads=8",
    "model.ffn_dim=28672",
    "model.vocab_size=128256",
    "recipe=llama",
    "data.seq_len=4096",
    "train.micro_batch_size=1",
    "train.global_batch_size=1024",  # 4M tokens, as Llama 3 70B
]
BLOOM = [
    "model=opt66b",
    "model.family=bloom",  # ALiBi: planned on data.seq_len
    "model.name=bloom176b",
    "model.hidden_size=14336",
    "model.num_layers=70",
    "model.num_heads=112",
    "model.ffn_dim=57344",
    "model.vocab_size=250880",
    "data.seq_len=2048",
    "train.micro_batch_size=1",
    "nodes=48",
    "gpus_per_node=8",
    "cluster=local",
    "dry_run=true",
    "parallel.tensor=8",
]
CPU4 = ["cluster=local", "gpus_per_node=0", "cluster.cpu_tasks_per_node=4", "dry_run=true"]


pytestmark = pytest.mark.usefixtures("no_slurm")


# ---- checks and batch arithmetic -------------------------------------------------------------


@pytest.mark.parametrize(
    "value,words",
    [
        ("3", "stays within a node, whose 4 ranks (cluster.cpu_tasks_per_node=4) it must divide"),
        ("8", "stays within a node, whose 4 ranks"),
        ("0", "must be a whole number >= 1"),
    ],
)
def test_tp_beyond_a_node_or_not_dividing_it_is_refused_in_one_line(tmp_path, value, words):
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, *CPU4, f"parallel.tensor={value}")
    assert words in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"parallel.tensor={value}:")


@pytest.mark.parametrize("stage", [0, 3])
def test_zero0_and_zero3_with_tp_are_refused_and_never_recommended(tmp_path, stage):
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, *CPU4, "parallel.tensor=2", f"deepspeed=zero{stage}")
    assert str(err.value).startswith(f"parallel.tensor=2 with deepspeed.stage={stage}: DeepSpeed")
    assert "deepspeed=zero2" in str(err.value) and "\n" not in str(err.value)
    best = memory.recommend(
        memory.OPT_SIZES["opt66b"],
        nodes=8,
        gpus_per_node=8,
        gpu_mem_bytes=int(79.1 * GiB),
        tensor_parallel=8,
    )
    assert best is not None and best.setting.stage in (1, 2)


def test_tp_must_divide_the_heads_and_above_the_kv_heads_is_a_warning(tmp_path):
    with pytest.raises(ConfigError, match=r"must divide model.num_heads=6 .*parallel.tensor=1\|2"):
        planned(tmp_path, *CPU4, "model.num_heads=6", "model.hidden_size=48", "parallel.tensor=4")
    cfg = planned(tmp_path, *CPU4, "model=llama_tiny", "parallel.tensor=4")
    kv = typed(cfg).model.num_kv_heads
    assert kv is not None and kv < 4
    report = preflight.report(typed(cfg))
    assert plan_line(report, "warning: parallel.tensor=4 exceeds model.num_kv_heads")


def test_data_parallel_size_is_world_over_tp_in_the_batch_and_the_ds_config(tmp_path):
    cfg = typed(planned(tmp_path, *CPU4, "parallel.tensor=2", "train.micro_batch_size=2"))
    assert cfg.train.global_batch_size == 4  # micro 2 x accumulation 1 x DP 2
    cfg.train.global_batch_size = 8
    assert (data_parallel(cfg, 4), grad_accumulation(cfg, 4)) == (2, 2)
    built = ds_config.build(cfg, 4)
    assert built["tensor_parallel"] == {"autotp_size": 2, "vocab_parallel_lm_head": False}
    assert built["gradient_accumulation_steps"] == 2 and built["train_batch_size"] == 8
    plain = typed(planned(tmp_path, *CPU4))
    assert "tensor_parallel" not in ds_config.build(plain, 4)
    with pytest.raises(ConfigError, match=r"global_batch_size=7: .* = 1 x 2 = 2 \(world 4 / "):
        planned(
            tmp_path,
            *CPU4,
            "parallel.tensor=2",
            "train.micro_batch_size=1",
            "train.global_batch_size=7",
        )


def test_tp_is_a_result_key_and_its_default_keeps_the_fingerprint(tmp_path):
    base = rundir.fingerprint(planned(tmp_path, *CPU4))
    assert rundir.fingerprint(planned(tmp_path, *CPU4, "parallel.tensor=1")) == base
    assert rundir.fingerprint(planned(tmp_path, *CPU4, "parallel.tensor=2")) != base


# ---- the planner ----------------------------------------------------------------------------


def test_a_tp_rank_holds_the_layers_matmuls_over_tp_and_its_activations_shrink():
    shape = memory.OPT_SIZES["opt66b"]
    whole, sharded = memory.param_count(shape), parallel_plan.sharded_params(shape)
    assert sharded == 64 * (4 * 9216**2 + 2 * 9216 * 36864)  # q k v out, fc1 fc2 weights
    assert parallel_plan.rank_params(shape, 8) == whole - sharded * 7 // 8
    one = memory.plan_memory(shape, stage=2, nodes=64, gpus_per_node=8, micro_batch=1)
    eight = memory.plan_memory(
        shape, stage=2, nodes=64, gpus_per_node=8, micro_batch=1, tensor_parallel=8
    )
    assert eight.activations < one.activations / 2 and eight.params < one.params / 6


def test_opt66b_on_64x8_with_tp8_plans_and_fits(tmp_path):
    report = preflight.report(typed(planned(tmp_path, "model=opt66b", *H100)))
    assert plan_line(report, "plan: world size 512").startswith(
        "plan: world size 512: global batch 1024 = micro 1 x grad accumulation 16 x "
        "data-parallel 64 (world 512 / tensor-parallel 8"
    )
    assert "a TP rank holds 8.64B of the 65.7B params" in plan_line(
        report, "plan: tensor-parallel 8"
    )
    comm = plan_line(report, "plan: communication per step")
    assert "4,096 of micro 1 x seq 2048 x hidden 9216 x 2 B = 36 MiB each (154.6 GB a step)" in comm
    assert "DP (ZeRO-2) over 64 ranks" in comm and "34.6 GB of gradients each micro step" in comm
    assert plan_line(report, "plan: memory/GPU").startswith("plan: memory/GPU 39.1 GiB of 79.1 GiB")
    assert plan_line(report, "plan: fits")
    assert plan_line(report, "plan: MFU").startswith(
        "plan: MFU 35% (estimate from the table: H100-SXM, ZeRO-0-2, >30B, TP=8: Llama 3 405B"
    )
    assert "without tensor parallelism" not in plan_line(report, "plan: MFU")
    assert "MFU 35%, an estimate" in plan_line(report, "plan: ETA")


def test_llama3_70b_shape_on_64x8_with_tp8_plans_and_fits(tmp_path):
    report = preflight.report(typed(planned(tmp_path, *LLAMA70, *H100)))
    assert plan_line(report, "plan: world size 512").startswith(
        "plan: world size 512: global batch 1024 = micro 1 x grad accumulation 16 x "
        "data-parallel 64"
    )
    assert "a TP rank holds 10.7B of the 70.6B params" in plan_line(
        report, "plan: tensor-parallel 8"
    )
    comm = plan_line(report, "plan: communication per step")
    assert "5,120 of micro 1 x seq 4096 x hidden 8192 x 2 B = 64 MiB each" in comm
    assert plan_line(report, "plan: memory/GPU").startswith("plan: memory/GPU 64.0 GiB of 79.1 GiB")
    assert plan_line(report, "plan: fits")
    assert plan_line(report, "plan: MFU").startswith("plan: MFU 35% (estimate from the table:")
    # the kv heads (8) are not exceeded: no warning
    assert not [ln for ln in report.lines if ln.startswith("warning: parallel.tensor")]


def test_bloom176b_shape_on_48x8_global_batch_2048_names_what_divides(tmp_path):
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, *BLOOM, "train.global_batch_size=2048")
    assert str(err.value) == (
        "train.global_batch_size=2048: not divisible by micro batch x data-parallel size = 1 x 48 "
        "= 48 (world 384 / parallel.tensor=8); nearest that divide: train.global_batch_size=2016 "
        "or 2064; no parallel.tensor in (1, 2, 4, 8) and micro batch up to 4 divides 2048 on 384 "
        "ranks; with parallel.tensor=8 nodes=32 or 64 do"
    )
    nearest = typed(planned(tmp_path, *BLOOM, "train.global_batch_size=2016"))
    assert grad_accumulation(nearest, 384) == 42
    report = preflight.report(nearest)
    assert "tensor-parallel 8 x data-parallel 48" in plan_line(report, "plan: tensor-parallel 8")


def test_the_mfu_table_has_a_tp_key():
    assert mfu.table("H100-SXM", 2, 66e9, tp=8)[0] == 0.35
    assert mfu.table("H100-SXM", 2, 66e9, tp=1)[0] == 0.30
    assert mfu.table("H100-SXM", 2, 13e9, tp=2)[0] == pytest.approx(0.35)  # 40% less 5 points
    assert "TP=2" in mfu.table("H100-SXM", 2, 13e9, tp=2)[1]
