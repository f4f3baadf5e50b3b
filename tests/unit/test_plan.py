"""The memory planner: parameter counts, DeepSpeed's estimators, activations, recommend()."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slurmtrain.common.errors import ConfigError
from slurmtrain.planning.memory import (
    LOGIT_BYTES,
    OPT_SIZES,
    GiB,
    OptShape,
    activation_bytes,
    candidates,
    largest_layer_params,
    param_count,
    plan_memory,
    recommend,
    summary,
)
from slurmtrain.planning.shapes import shipped

LAYOUTS = [(1, 8), (8, 8)]  # (nodes, gpus_per_node)
TOL = 0.05
# The OPT sizes and the Llama-/Mistral-shaped planning configs (GQA, gated MLP, untied head).
PLANNED = {**OPT_SIZES, **{n: shipped()[n] for n in ("llama3_8b", "mistral_7b")}}


@pytest.fixture(scope="module")
def ds_estimators():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return stage_1_and_2, stage3


def _rel(ours: float, ref: float) -> float:
    return abs(ours - ref) / ref


# -- parameter counts -----------------------------------------------------------------------------


def test_param_count_matches_published_opt_sizes():
    assert param_count(OPT_SIZES["opt125m"]) == pytest.approx(125.2e6, rel=1e-3)
    assert param_count(OPT_SIZES["opt350m"]) == pytest.approx(331.2e6, rel=1e-3)
    assert param_count(OPT_SIZES["opt1.3b"]) == pytest.approx(1.3158e9, rel=1e-4)
    assert param_count(OPT_SIZES["opt66b"]) == pytest.approx(65.7e9, rel=1e-2)


@pytest.mark.parametrize(
    "extra",
    [{}, {"word_embed_proj_dim": 32, "do_layer_norm_before": False}],
    ids=["pre_ln", "post_ln_projected"],
)
def test_param_count_and_largest_layer_match_transformers_opt(extra, ds_estimators):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.OPTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        ffn_dim=256,
        num_attention_heads=4,
        vocab_size=512,
        max_position_embeddings=512,
        **extra,
    )
    model = transformers.OPTForCausalLM(cfg)
    shape = OptShape(
        "tiny",
        2,
        64,
        4,
        256,
        vocab_size=512,
        max_positions=512,
        word_embed_proj_dim=extra.get("word_embed_proj_dim"),
        layer_norm_before=extra.get("do_layer_norm_before", True),
    )
    total, largest = ds_estimators[1].model_to_params(model)  # tied lm_head counted once
    assert param_count(shape) == total
    assert largest_layer_params(shape) == largest


def test_opt_table_agrees_with_the_model_configs():
    conf = Path(__file__).resolve().parents[2] / "conf" / "model"
    if not conf.is_dir():
        pytest.skip("no conf/model directory")
    from omegaconf import OmegaConf

    for name, shape in OPT_SIZES.items():
        yaml = OmegaConf.load(conf / f"{name}.yaml")
        for key in ("num_layers", "hidden_size", "num_heads", "ffn_dim"):
            assert yaml[key] == getattr(shape, key), (name, key)
        assert yaml.get("word_embed_proj_dim") == shape.word_embed_proj_dim, name
        assert yaml.get("layer_norm_before", True) == shape.layer_norm_before, name


# -- model states against DeepSpeed's estimators ---------------------------------------------------


@pytest.mark.parametrize("nodes,gpus", LAYOUTS)
@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", list(PLANNED))
def test_stage_1_2_model_states_match_deepspeed(name, stage, offload, nodes, gpus, ds_estimators):
    model, est = PLANNED[name], ds_estimators[0].estimate_zero2_model_states_mem_needs
    p, n = param_count(model), nodes * gpus
    cpu_ref, gpu_ref = est(
        total_params=p, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload
    )
    if stage == 1:  # stage 1 keeps whole 16-bit grads; DeepSpeed's formula partitions them
        gpu_ref += 2 * p if offload else 2 * p - 2 * p // n
    plan = plan_memory(
        model, stage=stage, offload_optimizer=offload, nodes=nodes, gpus_per_node=gpus
    )
    assert _rel(plan.model_states, gpu_ref) < TOL
    # Host: DeepSpeed's figure is max(an fp32 model built on the host by every rank, the offloaded
    # 16 bytes/param) x 1.5; slurmtrain builds on the GPU (planning/host_memory.py), so only the
    # offloaded term is DeepSpeed's: 16 bytes/param over the job's GPUs, x 1.5, per node.
    assert plan.host.build == 0
    assert _rel(plan.host.offload + 1, (16 * p / n * gpus * 1.5 if offload else 0) + 1) < TOL
    assert cpu_ref >= 4 * p * gpus  # what it assumed instead: one fp32 model per rank


@pytest.mark.parametrize("nodes,gpus", LAYOUTS)
@pytest.mark.parametrize("offload", ["none", "optimizer", "optimizer+param"])
@pytest.mark.parametrize("name", list(PLANNED))
def test_stage_3_model_states_match_deepspeed(name, offload, nodes, gpus, ds_estimators):
    model = PLANNED[name]
    opt, prm = offload != "none", offload == "optimizer+param"
    cpu_ref, gpu_ref, _ = ds_estimators[1].estimate_zero3_model_states_mem_needs(
        total_params=param_count(model),
        largest_layer_params=largest_layer_params(model),
        num_gpus_per_node=gpus,
        num_nodes=nodes,
        cpu_offload=opt,
        cpu_offload_params=prm,
        zero_init=True,
    )
    plan = plan_memory(
        model, stage=3, offload_optimizer=opt, offload_param=prm, nodes=nodes, gpus_per_node=gpus
    )
    assert _rel(plan.model_states, gpu_ref) < TOL
    if opt:  # zero.Init: DeepSpeed's host figure is the offloaded states, as ours
        assert _rel(plan.host.offload, cpu_ref) < TOL
    else:  # its budget of one fp32 largest layer a rank; zero.Init builds it on the GPU here
        assert plan.host.build == 0 and plan.cpu_per_node == plan.host.process


def _printed_rows(text: str) -> list[tuple[float, float, str]]:
    rows = re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.+)$", text, flags=re.MULTILINE)
    return [(float(c) * GiB, float(g) * GiB, opts) for c, g, opts in rows]


@pytest.mark.parametrize("name", ["opt13b", "opt66b"])
def test_all_cold_printouts_agree(name, ds_estimators, capsys):
    model = OPT_SIZES[name]
    p, big = param_count(model), largest_layer_params(model)
    ds_estimators[0].estimate_zero2_model_states_mem_needs_all_cold(p, 8, 1)
    for _cpu, gpu, opts in _printed_rows(capsys.readouterr().out):
        plan = plan_memory(model, stage=2, offload_optimizer="offload_optimizer=none" not in opts)
        assert _rel(plan.model_states, gpu) < TOL, opts  # host: the test above says why not
    ds_estimators[1].estimate_zero3_model_states_mem_needs_all_cold(p, big, 8, 1)
    rows = [r for r in _printed_rows(capsys.readouterr().out) if "zero_init=1" in r[2]]
    assert len(rows) == 3
    for cpu, gpu, opts in rows:
        plan = plan_memory(
            model,
            stage=3,
            offload_optimizer="offload_optimizer=none" not in opts,
            offload_param="offload_param=none" not in opts,
        )
        assert _rel(plan.model_states, gpu) < TOL, opts
        if "offload_optimizer=none" not in opts:
            assert _rel(plan.host.offload, cpu) < TOL, opts


# -- activations and the rest of the plan ----------------------------------------------------------


def test_activation_formula_by_hand():
    m = OPT_SIZES["opt1.3b"]  # L=24, h=2048, a=32, vocab 50272
    s, b = 2048, 1
    logits = s * b * 50272 * (2 + 4 + 4)
    assert activation_bytes(m, b, s, 2, False, "sdpa") == 24 * 34 * s * b * 2048 + logits
    eager_layer = 34 * s * b * 2048 + 5 * 32 * s * s * b  # Korthikanti: sbh(34 + 5as/h)
    assert activation_bytes(m, b, s, 2, False, "eager") == 24 * eager_layer + logits
    # checkpointing: each layer's 16-bit input plus one layer recomputed in full
    inputs = 24 * 2 * s * b * 2048
    assert activation_bytes(m, b, s, 2, True, "eager") == inputs + eager_layer + logits
    fp32 = activation_bytes(m, b, s, 4, False, "sdpa")
    assert fp32 == 2 * 24 * 34 * s * b * 2048 + s * b * 50272 * LOGIT_BYTES[4]


def test_checkpointing_and_smaller_batches_shrink_activations():
    m = OPT_SIZES["opt6.7b"]
    full = plan_memory(m, stage=3, micro_batch=4)
    ckpt = plan_memory(m, stage=3, micro_batch=4, activation_checkpointing=True)
    half = plan_memory(m, stage=3, micro_batch=2)
    assert ckpt.activations < full.activations / 4
    assert half.activations < full.activations
    assert ckpt.model_states == full.model_states


def test_total_is_the_sum_of_its_parts_and_fits_compares_with_it():
    plan = plan_memory(OPT_SIZES["opt1.3b"], stage=2, micro_batch=2)
    parts = plan.params + plan.grads + plan.optimizer + plan.activations + plan.buffers
    assert plan.total == parts + plan.overhead
    assert plan.overhead > GiB  # the CUDA context alone
    assert plan.fits(plan.total) and not plan.fits(plan.total - 1)
    assert not plan.fits(plan.total, cpu_mem_bytes_per_node=plan.cpu_per_node - 1)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"stage": 2, "offload_param": True, "offload_optimizer": True}, "deepspeed.offload_param"),
        ({"stage": 0, "offload_optimizer": True}, "deepspeed.offload_optimizer"),
        ({"stage": 5}, "deepspeed.stage"),
        ({"dtype": "int8"}, "deepspeed.dtype"),
        ({"seq_len": 4096}, "data.seq_len"),
        ({"micro_batch": 0}, "train.micro_batch_size"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
    ],
)
def test_bad_settings_fail_with_one_line_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=re.escape(key)) as err:
        plan_memory(OPT_SIZES["opt125m"], **kwargs)
    assert "\n" not in str(err.value)


# -- recommend -------------------------------------------------------------------------------------


def test_opt66b_on_one_node_needs_more_than_zero2():
    m, gpu = OPT_SIZES["opt66b"], 80 * GiB
    zero2 = plan_memory(m, stage=2, nodes=1, gpus_per_node=8)
    assert not zero2.fits(gpu)
    rec = recommend(m, nodes=1, gpus_per_node=8, gpu_mem_bytes=gpu)
    assert rec is not None and rec.plan.fits(gpu)
    assert rec.setting.stage == 3
    line = summary(zero2, gpu, rec)
    assert line.startswith("opt66b zero2 mb=1 seq=2048: ")
    assert "> 80.0 GiB; fits with deepspeed=zero3" in line


def test_opt125m_fits_plain_data_parallel():
    rec = recommend(OPT_SIZES["opt125m"], nodes=1, gpus_per_node=8, gpu_mem_bytes=80 * GiB)
    assert rec is not None
    s = rec.setting
    assert (s.stage, s.offload_optimizer, s.activation_checkpointing) == (0, False, False)
    assert rec.setting.micro_batch == 16
    assert summary(rec.plan, 80 * GiB).endswith("(fits)")


def test_recommend_returns_the_first_fitting_candidate():
    m, gpu = OPT_SIZES["opt30b"], 80 * GiB
    rec = recommend(m, nodes=1, gpus_per_node=8, gpu_mem_bytes=gpu)
    order = candidates()
    index = order.index(rec.setting)
    for earlier in order[:index]:
        assert not plan_memory(m, nodes=1, gpus_per_node=8, **earlier.knobs()).fits(gpu)


def test_candidate_order_offload_last_checkpointing_late_biggest_batch_first():
    order = candidates(max_micro_batch=8)
    offload = [c.offload_optimizer for c in order]
    assert offload == sorted(offload)  # every no-offload setting before any offload
    no_off = [c for c in order if not c.offload_optimizer]
    ckpt = [c.activation_checkpointing for c in no_off]
    assert ckpt == sorted(ckpt)  # checkpointing only after every batch size without it
    assert [c.micro_batch for c in no_off[:4]] == [8, 4, 2, 1] and no_off[0].stage == 0
    assert not any(c.offload_param and c.stage != 3 for c in order)


def test_recommend_honours_global_batch_and_host_memory():
    m = OPT_SIZES["opt125m"]
    rec = recommend(m, nodes=1, gpus_per_node=8, gpu_mem_bytes=80 * GiB, global_batch_size=32)
    assert rec.setting.micro_batch == 4  # 32 / 8 GPUs
    big = OPT_SIZES["opt66b"]
    assert (
        recommend(
            big, nodes=1, gpus_per_node=8, gpu_mem_bytes=80 * GiB, cpu_mem_bytes_per_node=512 * GiB
        )
        is None
    )  # offload needs > 1 TiB of host
    plan = plan_memory(big, stage=2, nodes=1, gpus_per_node=8)
    assert "nothing fits" in summary(plan, 80 * GiB, None)


def test_plan_table_prints_every_size(capsys):
    from slurmtrain.cli.plan_table import main

    assert main(["--markdown", "--nodes", "1,8"]) == 0
    out = capsys.readouterr().out
    assert "| model | params | 1 x 8 GPUs | 8 x 8 GPUs |" in out
    for name in OPT_SIZES:
        assert f"| {name} |" in out


def test_the_gradient_bucket_is_planned_whole_as_deepspeed_allocates_it():
    # DeepSpeed's contiguous_gradients buffer is torch.empty(reduce_bucket_size) even for a model
    # smaller than the bucket (measured on opt_tiny: one 200 MB allocation for 166k fp32 params).
    tiny = OptShape("tiny", 2, 64, 4, 256, vocab_size=512, max_positions=512)
    for stage in (1, 2):
        plan = plan_memory(tiny, stage=stage, dtype="fp32", seq_len=128, reduce_bucket=5 * 10**7)
        assert plan.buffers == 4 * 5 * 10**7
        doubled = plan_memory(
            tiny, stage=stage, dtype="fp32", seq_len=128, reduce_bucket=5 * 10**7, overlap_comm=True
        )
        assert doubled.buffers == 2 * plan.buffers
    assert plan_memory(tiny, stage=0, dtype="fp32", seq_len=128).buffers == 4 * param_count(tiny)


def test_cpu_ranks_get_no_cuda_context_in_their_plan():
    plan = plan_memory(OPT_SIZES["opt125m"], device="cpu", dtype="fp32")
    assert plan.overhead == 0 and plan.total == plan.model_states + plan.activations + plan.buffers
