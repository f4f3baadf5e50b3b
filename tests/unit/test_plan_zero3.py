"""The memory plan's ZeRO-3 buffers come from the stage3_* values the run gives DeepSpeed
(ds_config.zero_section, deepspeed.extra included), not from a fixed prefetch bucket."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import ds_config, schema
from slurmtrain.planning import preflight, zero3_params
from slurmtrain.planning.memory import plan_memory
from slurmtrain.planning.shapes import OPT_SIZES, largest_layer_params, param_count

schema.register()


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        return compose(
            "config",
            overrides=["cluster=local", "gpus_per_node=8", "deepspeed=zero3", *overrides],
        )


@pytest.mark.parametrize("name", list(OPT_SIZES))
def test_the_tensors_add_up_to_the_parameter_count(name):
    model = OPT_SIZES[name]
    assert sum(zero3_params.tensor_sizes(model)) == param_count(model)


def test_opt66b_plans_the_prefetch_and_persistence_deepspeed_is_given():
    cfg = _cfg("model=opt66b")
    zero = ds_config.zero_section(cfg)
    m, h = cfg.model, cfg.model.hidden_size
    layer = 12 * h * h  # one layer's weights: what ds_config prefetches (and 2 of them live)
    assert zero["stage3_prefetch_bucket_size"] == layer and layer > 50_000_000
    # prefetch one layer (under max_live - the running module); persistent: per layer 4 attention
    # biases, fc1's (4h) and fc2's, 2 norms x 2; the final norm's 2
    ahead = min(layer, zero["stage3_max_live_parameters"] - largest_layer_params(m))
    persistent = m.num_layers * 13 * h + 2 * h
    assert zero3_params.extra_gathered(m, zero) == ahead + persistent
    plan = preflight.memory_plan(cfg, 64)
    assert plan.buffers == 2 * (zero["reduce_bucket_size"] + ahead + persistent)  # bf16


def test_deepspeed_extra_stage3_values_reach_the_plan():
    base = preflight.memory_plan(_cfg("model=opt66b"), 64)
    small = preflight.memory_plan(
        _cfg("model=opt66b", "+deepspeed.extra.zero_optimization.stage3_prefetch_bucket_size=2e8"),
        64,
    )
    layer = 12 * 9216**2
    assert base.buffers - small.buffers == 2 * (layer - 2 * 10**8)
    # max_live caps the prefetch: 5e8 live, the 463M-element embedding running, 37M ahead
    capped = _cfg(
        "model=opt66b", "+deepspeed.extra.zero_optimization.stage3_max_live_parameters=5e8"
    )
    ahead = 5 * 10**8 - largest_layer_params(capped.model)
    got = zero3_params.extra_gathered(capped.model, ds_config.zero_section(capped))
    assert got == ahead + 64 * 13 * 9216 + 2 * 9216
    nothing = _cfg(
        "model=opt66b", "+deepspeed.extra.zero_optimization.stage3_param_persistence_threshold=0"
    )
    assert zero3_params.extra_gathered(nothing.model, ds_config.zero_section(nothing)) == layer


def test_without_a_zero_section_the_plan_assumes_what_ds_config_gives_the_model():
    m = OPT_SIZES["opt13b"]
    given = ds_config.stage3_section(m.hidden_size)
    assert plan_memory(m, stage=3) == plan_memory(m, stage=3, zero3=given)
    # DeepSpeed's own defaults where a section leaves the keys out (5e7 prefetch, 1e5 persistence)
    bare = plan_memory(m, stage=3, zero3={})
    assert bare.buffers == 2 * (500_000_000 + 50_000_000 + 40 * 13 * 5120 + 2 * 5120)
