"""The DeepSpeed config of the recipe: the optimizer per placement, ZeRO-3's
prefetch/live/persistence from the layer size, gradients reduced in fp32 for bf16 runs."""

from __future__ import annotations

import pytest
import torch

from slurmtrain.common import ds_config
from tests.unit.test_recipes_placement import _cfg


def _gpu(*overrides: str):
    cfg = _cfg(*overrides)
    cfg.gpus_per_node = 8  # composed as a CPU run, then placed on GPUs (what the plan sees)
    return cfg


def test_gpu_resident_state_steps_with_torchs_fused_adamw():
    params = ds_config.build(_gpu("model=opt13b"), 512)["optimizer"]["params"]
    assert params["torch_adam"] is True and params["fused"] is True
    # DeepSpeed passes what it does not pop to torch.optim.AdamW: it must take every key.
    net = torch.nn.Linear(2, 2)
    kwargs = {k: v for k, v in params.items() if k != "torch_adam"}
    torch.optim.AdamW(net.parameters(), **kwargs)


def test_offloaded_state_steps_with_deepspeeds_cpu_adam_and_cpu_runs_with_plain_torch():
    offload = ds_config.build(_gpu("model=opt13b", "deepspeed=zero3_offload"), 512)
    params = offload["optimizer"]["params"]
    # No torch_adam: DeepSpeed picks DeepSpeedCPUAdam for offloaded optimizer state.
    assert "torch_adam" not in params and "fused" not in params
    assert offload["optimizer"]["type"] == "AdamW"
    cpu = ds_config.build(_cfg(), 2)["optimizer"]["params"]
    assert cpu["torch_adam"] is True and "fused" not in cpu  # no JIT build, same as before
    cpu_offload = ds_config.build(_cfg("deepspeed=zero3_offload"), 2)["optimizer"]["params"]
    assert cpu_offload["torch_adam"] is True


@pytest.mark.parametrize("size,hidden", [("opt13b", 5120), ("opt66b", 9216)])
def test_zero3_prefetches_a_layer_and_keeps_two_live(size, hidden):
    # The section DeepSpeed trains with and the planner reads (zero_section).
    zero = ds_config.zero_section(_gpu(f"model={size}", "deepspeed=zero3"))
    layer = 12 * hidden**2  # one transformer layer's weights
    assert zero["stage3_prefetch_bucket_size"] == layer  # the next layer gathered during this one
    assert zero["stage3_max_live_parameters"] == max(int(1e9), 2 * layer)
    assert zero["stage3_param_persistence_threshold"] == 10 * hidden  # biases and norms stay
    if size == "opt66b":  # DeepSpeed's defaults fetched 5% of a layer ahead and held < 1 layer
        assert zero["stage3_prefetch_bucket_size"] > 20 * 5e7 and layer > 1e9
    assert "stage3_prefetch_bucket_size" not in ds_config.zero_section(_gpu(f"model={size}"))


def test_tiny_models_keep_deepspeeds_zero3_defaults_as_floors():
    zero = ds_config.build(_cfg("deepspeed=zero3"), 2)["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == int(5e7)
    assert zero["stage3_max_live_parameters"] == int(1e9)


def test_bf16_runs_accumulate_and_reduce_gradients_in_fp32():
    bf16 = ds_config.build(_gpu("model=opt13b"), 512)
    assert bf16["bf16"]["enabled"] is True
    assert bf16["communication_data_type"] == "fp32"
    assert bf16["data_types"] == {"grad_accum_dtype": "fp32"}
    for stage in (0, 1):  # 0: DeepSpeed refuses the mix; 1: it would change the optimizer
        low = ds_config.build(_gpu("model=opt13b", f"deepspeed=zero{stage}"), 512)
        assert low["communication_data_type"] == "fp32" and "data_types" not in low
    zero3 = ds_config.build(_gpu("model=opt13b", "deepspeed=zero3"), 512)
    assert zero3["data_types"] == {"grad_accum_dtype": "fp32"}
    for other in ("deepspeed.dtype=fp32", "deepspeed.dtype=fp16"):
        built = ds_config.build(_gpu("model=opt13b", other), 512)
        assert "communication_data_type" not in built and "data_types" not in built
    chosen = _gpu("model=opt13b", "+deepspeed.extra.communication_data_type=bf16")
    assert ds_config.build(chosen, 512)["communication_data_type"] == "bf16"  # extra still wins


def test_bf16_leaves_the_overflow_check_to_the_loops_guard_unless_zero_computes_no_norm():
    """The loop fails a non-finite loss or gradient norm on its own all-reduce and rolls back;
    DeepSpeed's check would add a host sync per step."""
    assert ds_config.build(_gpu("model=opt13b"), 512)["bf16"]["check_grad_overflow"] is False
    no_norm = _gpu(
        "model=opt13b",
        "optim.grad_clip=0",
        "+deepspeed.extra.zero_optimization.compute_grad_norm=false",
    )
    assert ds_config.build(no_norm, 512)["bf16"]["check_grad_overflow"] is True
    mine = _gpu("model=opt13b", "+deepspeed.extra.bf16.check_grad_overflow=true")
    assert ds_config.build(mine, 512)["bf16"]["check_grad_overflow"] is True  # extra wins
