"""Sequence parallelism at login (issue 33, build 6): parallel.sequence's one-line refusals, DP =
world / (TP x SP) in the batch arithmetic and the ds config, and the plan of a Llama-3-8B run at
seq 8192 on 8 x 8 H100s with SP 8: it names SP x DP, a rank's sequence slice (its activations),
the Ulysses all-to-alls, and the same FLOPs per GPU as without SP."""

from __future__ import annotations

import pytest

from slurmtrain.common import ds_config, rundir
from slurmtrain.common.derived import data_parallel, grad_accumulation
from slurmtrain.common.errors import ConfigError
from slurmtrain.login.composed import typed
from slurmtrain.planning import flops, preflight
from tests.plans import plan_line, planned

CPU4 = ["cluster=local", "gpus_per_node=0", "cluster.cpu_tasks_per_node=4", "dry_run=true"]
LLAMA8 = [
    "model=llama3_8b",
    "recipe=llama",
    "nodes=8",
    "gpus_per_node=8",
    "cluster=local",
    "dry_run=true",
    "data.seq_len=8192",
    "train.micro_batch_size=1",
    "train.global_batch_size=64",
]

pytestmark = pytest.mark.usefixtures("no_slurm")


# ---- refusals: one line, key, value and fix ---------------------------------------------------


@pytest.mark.parametrize(
    "overrides,start,fix",
    [
        (["parallel.sequence=0"], "parallel.sequence=0: must be a whole number >= 1", "=2"),
        (
            ["parallel.sequence=2", "model.attn_implementation=eager"],
            "parallel.sequence=2 with model.attn_implementation=eager (eager for opt): DeepSpeed "
            "Ulysses cannot wrap eager attention",
            "use model.attn_implementation=sdpa",
        ),
        (
            ["parallel.sequence=2", "data.seq_len=127"],
            "parallel.sequence=2: must divide data.seq_len=127",
            "use data.seq_len=126 or 128",
        ),
        (
            ["parallel.sequence=2", "parallel.tensor=2"],
            "parallel.sequence=2 with parallel.tensor=2: not supported together",
            "use parallel.tensor=1 or parallel.sequence=1",
        ),
        (
            ["parallel.sequence=2", "cluster.cpu_tasks_per_node=3"],
            "parallel.sequence=2: does not divide the world size 3",
            "use a divisor of the ranks per node (3)",
        ),
        (
            # 12 query heads split by 6, but 4 kv heads neither split by 6 nor replicate evenly
            [
                "model=llama_tiny",
                "model.hidden_size=96",
                "model.num_heads=12",
                "model.num_kv_heads=4",
                "data.seq_len=96",
                "cluster.cpu_tasks_per_node=6",
                "parallel.sequence=6",
            ],
            "parallel.sequence=6: must divide model.num_heads=12 and divide or be a multiple of "
            "model.num_kv_heads=4",
            "use parallel.sequence=1|2|4",
        ),
    ],
)
def test_sp_refusals_are_one_line_with_the_fix(tmp_path, overrides, start, fix):
    with pytest.raises(ConfigError) as err:
        planned(tmp_path, *CPU4, *overrides)
    text = str(err.value)
    assert text.startswith(start) and fix in text and "\n" not in text, text


def test_sp_above_the_kv_heads_replicates_them_and_is_accepted(tmp_path):
    cfg = typed(planned(tmp_path, *CPU4, "model=llama_tiny", "parallel.sequence=4"))
    assert cfg.model.num_kv_heads == 2 and data_parallel(cfg, 4) == 1


# ---- batch arithmetic, ds config, fingerprint -------------------------------------------------


def test_data_parallel_size_is_world_over_sp_in_the_batch_and_the_ds_config(tmp_path):
    cfg = typed(planned(tmp_path, *CPU4, "parallel.sequence=2", "train.micro_batch_size=2"))
    assert cfg.train.global_batch_size == 4  # micro 2 x accumulation 1 x DP 2
    cfg.train.global_batch_size = 8
    assert (data_parallel(cfg, 4), grad_accumulation(cfg, 4)) == (2, 2)
    built = ds_config.build(cfg, 4)
    assert built["gradient_accumulation_steps"] == 2 and built["train_batch_size"] == 8
    assert "tensor_parallel" not in built  # Ulysses comes in through the mpu, not the dict
    with pytest.raises(ConfigError, match=r"global_batch_size=7: .* = 1 x 2 = 2 \(world 4 / "):
        planned(
            tmp_path,
            *CPU4,
            "parallel.sequence=2",
            "train.micro_batch_size=1",
            "train.global_batch_size=7",
        )


def test_sp_is_a_result_key_and_its_default_keeps_the_fingerprint(tmp_path):
    base = rundir.fingerprint(planned(tmp_path, *CPU4))
    assert rundir.fingerprint(planned(tmp_path, *CPU4, "parallel.sequence=1")) == base
    assert rundir.fingerprint(planned(tmp_path, *CPU4, "parallel.sequence=2")) != base


# ---- the planner ----------------------------------------------------------------------------


def test_llama3_8b_at_seq_8192_on_8x8_with_sp8_plans_its_slice(tmp_path):
    cfg = typed(planned(tmp_path, *LLAMA8, "parallel.sequence=8"))
    report = preflight.report(cfg)
    assert plan_line(report, "plan: world size 64") == (
        "plan: world size 64: global batch 64 = micro 1 x grad accumulation 8 x data-parallel 8 "
        "(world 64 / sequence-parallel 8, DeepSpeed Ulysses)"
    )
    sp = plan_line(report, "plan: sequence-parallel 8 x data-parallel 8 (DeepSpeed Ulysses)")
    assert "each rank holds 1,024 of each sequence's 8,192 tokens" in sp
    assert "ZeRO partitions them over 64 ranks" in sp
    # FLOPs per GPU: the global batch's FLOPs over all 64 ranks, as without SP
    per_gpu = flops.flops_per_token(cfg.model, 8192) * 64 * 8192 / 64 / 1e12
    assert f"each GPU computes {per_gpu:,.0f} TFLOP a step" in sp and "474 TFLOP" in sp
    comm = plan_line(report, "plan: communication per step")
    assert comm.startswith(
        "plan: communication per step: SP all-to-alls over 8 ranks: 8 a layer a micro step "
        "(4 forward, 4 backward: q, k, v, output) x 32 layers x 8 micro steps of micro 1 x seq "
        "1024 x width 4096 (k, v: 1024) x 2 B = 40 MiB a layer a micro step (10.7 GB a step)"
    )
    assert "DP (ZeRO-2) over 64 ranks (data x sequence)" in comm

    # activations per rank: those of a seq/SP = 1,024-token sequence; everything else unchanged
    mine = preflight.memory_plan(cfg, 8)
    whole = typed(planned(tmp_path, *LLAMA8))
    slice_ = typed(planned(tmp_path, *LLAMA8, "data.seq_len=1024"))
    assert mine.activations == preflight.memory_plan(slice_, 8).activations
    assert mine.activations < preflight.memory_plan(whole, 8).activations / 7
    assert mine.params == preflight.memory_plan(whole, 8).params
    assert plan_line(report, "plan: memory/GPU").startswith("plan: memory/GPU 26.9 GiB of 79.1")
    # the ETA is the global batch's: the same line with or without SP
    eta = plan_line(report, "plan: ETA")
    assert eta == plan_line(preflight.report(whole), "plan: ETA")
