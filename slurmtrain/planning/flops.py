"""Training FLOPs per token of a model config, achieved TFLOPS, and MFU against a GPU's dense peak.

Pure arithmetic (no torch import; a family beyond OPT and the Llama-shaped ones is counted once on
the meta device, planning/shapes.py): the login node plans with it, the compute node logs with it.

FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B; the same count as Chinchilla's without
the softmax/elementwise terms):

    training = 6 * N_matmul + 12 * L * h * s        forward only = 2 * N_matmul + 4 * L * h * s

N_matmul counts the weights that take part in a matrix multiply, once per token: per layer
4h^2 (q, k, v, out projections) + 2*h*ffn (fc1, fc2), plus the lm_head (vocab x embed dim) and
OPT-350m's project_in/out. Embedding lookups, biases and layernorms are not matmuls and are left
out. A matmul is 2 FLOPs per weight per token forward and 4 backward (grad of input and of
weight), hence 6. The attention term: per layer and token, q.k^T over s keys and the weighted sum
of s values are 2*s*h FLOPs each forward (4*L*h*s), tripled for training. Like PaLM, it counts the
full s x s score matrix (no causal halving), which is also what kernels compute without skipping.
Other families (planning/shapes.py): N_matmul is q and o (h x a*d, a query heads of width d),
k and v (h x kv*d: GQA/MQA shrink only these), three h x ffn matrices for a gated (SwiGLU) MLP,
and the lm_head, tied or not (a tied head is one tensor but still a matmul); the attention term
uses a*d, the width of the scores' q.k^T, whatever the key-value heads. RoPE's rotations are
elementwise and left out like the norms; a sliding window (Mistral) is not subtracted.
Checkpointing recomputes the forward: `recompute=True` gives hardware FLOPs (8N + 16Lhs); MFU uses
model FLOPs (without recompute), so it does not reward recomputation.
"""

from __future__ import annotations

import re
from typing import Optional

from slurmtrain.planning import shapes
from slurmtrain.planning.shapes import ModelShape

# Dense (no structured sparsity) peak tensor-core TFLOPS by dtype, from NVIDIA / AMD datasheets.
# None: the dtype has no tensor-core path on that part (MFU is then undefined, not zero).
PEAK_TFLOPS: dict[str, dict[str, Optional[float]]] = {
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "H100-SXM": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100-PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "H100-NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # H100 SXM compute
    "H200-NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "GH200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    "L40": {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "A30": {"bf16": 165.0, "fp16": 165.0, "tf32": 82.0, "fp32": 10.3},
    "A40": {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4},
    "RTX-A6000": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "V100-SXM": {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "V100-PCIe": {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0},
    "V100S": {"bf16": None, "fp16": 130.0, "tf32": None, "fp32": 16.4},
    "T4": {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1},
    # GeForce: 16-bit inputs with fp32 accumulation (what PyTorch uses), Ada/Ampere whitepapers.
    "RTX-4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "RTX-3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    # Export parts: H800 keeps H100 SXM compute (NVLink and FP64 cut), A800 keeps A100's (NVLink
    # cut); H20 (Hopper, cut compute): NVIDIA H20 product brief, 148 TFLOPS dense FP16/BF16.
    "H800": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A800": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "H20": {"bf16": 148.0, "fp16": 148.0, "tf32": 74.0, "fp32": 44.0},
    # Blackwell: NVIDIA's HGX B200 / GB200 NVL72 datasheets list per-GPU tensor figures *with*
    # 2:4 sparsity (B200 4.5 PF, GB200 5 PF FP16/BF16; TF32 2.2 / 2.5 PF); dense is half.
    # FP32 (no tensor core): 75 / 80 TFLOPS. GB200's GPU runs at 1200 W, B200's at 1000 W.
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0},
    "GB200": {"bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0},
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4},
    # Per GCD: an MI250X package is two dies (383 TFLOPS bf16, 95.7 fp32 matrix for both), and
    # Slurm (LUMI's gres, ROCR_VISIBLE_DEVICES) and torch count each die as one GPU, one rank.
    "MI250X": {"bf16": 191.5, "fp16": 191.5, "tf32": None, "fp32": 47.9},
}

# torch.cuda.get_device_name() strings -> table key; first match wins, so specific before general.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bGH200\b", "GH200"),
    (r"\bGB200\b", "GB200"),
    (r"\bB200\b", "B200"),
    (r"\bH800\b", "H800"),
    (r"\bA800\b", "A800"),
    (r"\bH20\b", "H20"),  # a word: "H200" does not match
    (r"\bH200\b.*\bNVL\b", "H200-NVL"),
    (r"\bH200\b", "H200"),
    (r"\bH100\b.*\bPCIe\b", "H100-PCIe"),
    (r"\bH100\b.*\bNVL\b", "H100-NVL"),
    (r"\bH100\b", "H100-SXM"),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"\bA100\b", "A100"),
    (r"\bL40S\b", "L40S"),
    (r"\bL40\b", "L40"),
    (r"\bL4\b", "L4"),
    (r"\bA10\b", "A10"),
    (r"\bA30\b", "A30"),
    (r"\bA40\b", "A40"),
    (r"\bRTX A6000\b", "RTX-A6000"),
    (r"\bV100S\b", "V100S"),
    (r"\bV100\b.*\bPCIE\b", "V100-PCIe"),
    (r"\bV100\b", "V100-SXM"),
    (r"\bT4\b", "T4"),
    (r"\bRTX 4090\b", "RTX-4090"),
    (r"\bRTX 3090\b", "RTX-3090"),
    (r"\bMI300X\b", "MI300X"),
    (r"\bMI250X\b", "MI250X"),
)


def matmul_params(model: ModelShape) -> int:
    """Weights used in matrix multiplies, once per token (no biases, norms or lookups)."""
    return shapes.matmul_params(model)


def flops_per_token(
    model: ModelShape, seq_len: int, *, training: bool = True, recompute: bool = False
) -> float:
    """Model FLOPs per token: 6N + 12L(a*d)s for training, 2N + 4L(a*d)s forward (module doc)."""
    attention = 4 * model.num_layers * shapes.attention_width(model) * seq_len
    forward = 2 * matmul_params(model) + attention
    if not training:
        return float(forward)
    return float(forward * (4 if recompute else 3))


def tflops_per_gpu(tokens_per_s_per_gpu: float, flops_per_token: float) -> float:
    """Achieved TFLOPS of one GPU."""
    return tokens_per_s_per_gpu * flops_per_token / 1e12


def peak_key(device_name: str) -> Optional[str]:
    """The PEAK_TFLOPS key for a device name, or None when unknown (CPUs included)."""
    for pattern, key in _DEVICE_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return key
    return None


def detect_peak(device_name: str, dtype: str) -> Optional[float]:
    """Dense peak TFLOPS of `device_name` (torch.cuda.get_device_name) in `dtype`, or None."""
    key = peak_key(device_name or "")
    return PEAK_TFLOPS[key].get(dtype) if key else None


def mfu(
    tokens_per_s_per_gpu: float,
    flops_per_token: float,
    *,
    device_name: Optional[str] = None,
    dtype: str = "bf16",
    peak_tflops: Optional[float] = None,
) -> Optional[float]:
    """Model FLOPs utilisation in [0, 1]; None when no peak is known (e.g. on CPU) or given."""
    peak = (
        peak_tflops
        if peak_tflops is not None
        else (detect_peak(device_name, dtype) if device_name else None)
    )
    if not peak:
        return None
    return tflops_per_gpu(tokens_per_s_per_gpu, flops_per_token) / peak
