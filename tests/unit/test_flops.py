"""FLOPs per token, achieved TFLOPS, peak detection and MFU."""

from __future__ import annotations

import os

import pytest

from slurmtrain.planning.flops import (
    PEAK_TFLOPS,
    detect_peak,
    flops_per_token,
    matmul_params,
    mfu,
    peak_key,
    tflops_per_gpu,
)
from slurmtrain.planning.memory import OPT_SIZES, OptShape, param_count


def test_opt13b_flops_per_token_by_hand():
    m = OPT_SIZES["opt1.3b"]  # L=24, h=2048, ffn=8192, vocab=50272, s=2048
    per_layer = 4 * 2048 * 2048 + 2 * 2048 * 8192  # 16,777,216 + 33,554,432 = 50,331,648
    n_matmul = 24 * per_layer + 50272 * 2048  # 1,207,959,552 + 102,957,056 (lm_head)
    assert n_matmul == 1_310_916_608 == matmul_params(m)
    attention = 12 * 24 * 2048 * 2048  # 12 L h s = 1,207,959,552
    assert flops_per_token(m, 2048) == 6 * n_matmul + attention == 9_073_459_200
    assert flops_per_token(m, 2048, training=False) == 2 * n_matmul + attention // 3
    assert flops_per_token(m, 2048, recompute=True) == pytest.approx(4 / 3 * 9_073_459_200)


def test_matmul_params_leave_out_lookups_biases_and_norms():
    m = OPT_SIZES["opt125m"]
    h, f, L = 768, 3072, 12
    non_matmul = 2050 * h + L * (4 * h + f + h + 2 * 2 * h) + 2 * h  # positions, biases, norms
    assert param_count(m) - matmul_params(m) == non_matmul


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_matches_deepspeed_flops_profiler_on_tiny_opt(attn):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from deepspeed.profiling.flops_profiler import get_model_profile

    L, h, a, f, vocab, b, s = 2, 128, 4, 512, 512, 2, 128
    cfg = transformers.OPTConfig(
        hidden_size=h,
        num_hidden_layers=L,
        ffn_dim=f,
        num_attention_heads=a,
        vocab_size=vocab,
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(cfg).eval()
    ids = torch.randint(0, vocab, (b, s))
    # The profiler's flops = 2 x MACs for linear/matmul/sdpa plus elementwise ops (no MACs).
    fwd_flops, fwd_macs, _ = get_model_profile(
        model,
        kwargs={"input_ids": ids},
        print_profile=False,
        detailed=False,
        as_string=False,
        warm_up=0,
    )
    ours = flops_per_token(OptShape("tiny", L, h, a, f, vocab, 256), s) * b * s
    assert 3 * fwd_flops == pytest.approx(ours, rel=0.10)
    assert 3 * 2 * fwd_macs == pytest.approx(ours, rel=0.01)


def test_tflops_and_mfu_arithmetic():
    assert tflops_per_gpu(1000.0, 6e12) == pytest.approx(6000.0)
    # 3000 tok/s x 9.07e9 FLOPs = 27.2 TFLOPS on a 312-TFLOPS A100
    fpt = flops_per_token(OPT_SIZES["opt1.3b"], 2048)
    assert mfu(3000.0, fpt, device_name="NVIDIA A100-SXM4-80GB") == pytest.approx(
        3000 * fpt / 1e12 / 312.0
    )
    assert mfu(3000.0, fpt, peak_tflops=100.0) == pytest.approx(3000 * fpt / 1e14)


def test_mfu_is_none_without_a_known_peak():
    assert mfu(100.0, 1e9, device_name="cpu") is None
    assert mfu(100.0, 1e9) is None
    assert mfu(100.0, 1e9, device_name="Tesla V100-SXM2-32GB", dtype="bf16") is None
    assert mfu(100.0, 1e9, device_name="cpu", peak_tflops=2.0) == pytest.approx(0.05)


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A40", "A40"),
        ("Tesla V100-SXM2-32GB", "V100-SXM"),
        ("Tesla V100-PCIE-16GB", "V100-PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI250X", "MI250X"),
        ("NVIDIA A10G", None),
        ("cpu", None),
        ("", None),
    ],
)
def test_device_names_map_to_their_peak(name, key):
    assert peak_key(name) == key


def test_mi250x_peak_is_one_gcd():
    """Slurm on LUMI counts each MI250X die (GCD) as a GPU, one rank each: the peak per GPU is
    half the two-die package's 383 TFLOPS, else MFU and ETA are 2x optimistic (issue 35)."""
    assert detect_peak("AMD Instinct MI250X", "bf16") == pytest.approx(383.0 / 2)
    assert detect_peak("AMD Instinct MI250X", "fp32") == pytest.approx(95.7 / 2, abs=0.1)


def test_peak_values_are_dense_datasheet_figures():
    assert detect_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert detect_peak("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert detect_peak("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert detect_peak("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4)
    assert detect_peak("NVIDIA H200", "fp16") == pytest.approx(989.4)
    assert detect_peak("Tesla V100-SXM2-32GB", "fp16") == 125.0
    assert detect_peak("cpu", "bf16") is None
    for key, peaks in PEAK_TFLOPS.items():
        assert set(peaks) == {"bf16", "fp16", "tf32", "fp32"}, key
