"""OPT init as the recipe says: N(0, init_std), output projections / sqrt(2L) (metaseq's megatron init)."""

from __future__ import annotations

import math
import os

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema, validation

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def test_output_projections_are_scaled_by_one_over_sqrt_2L(monkeypatch):
    from slurmtrain.login.local_submit import free_port

    # One process of world size 1: DeepSpeed needs all five or it tries MPI discovery.
    for key, value in dict(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    ).items():
        monkeypatch.setenv(key, value)
    from slurmtrain.common import ds_config
    from slurmtrain.compute import model

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "cluster=local",
                "gpus_per_node=0",
                "deepspeed=zero2",
                "model.num_layers=4",
                "model.hidden_size=128",
                "model.ffn_dim=512",
                "model.init_std=0.006",
                "model.scaled_init=true",
            ],
        )
    validation.validate_config(cfg, submitting=False)
    net = model.build(cfg, ds_config.build(cfg, 1))
    scaled = 0.006 / math.sqrt(2 * 4)
    projections = model.output_projections(net)
    assert len(projections) == 2 * 4
    for layer in net.model.decoder.layers:
        assert layer.fc2.weight.std().item() == pytest.approx(scaled, rel=0.05)
        assert layer.self_attn.out_proj.weight.std().item() == pytest.approx(scaled, rel=0.1)
        assert layer.fc1.weight.std().item() == pytest.approx(0.006, rel=0.05)
        assert layer.self_attn.q_proj.weight.std().item() == pytest.approx(0.006, rel=0.1)
