"""How compute/model.py builds and scores the model: in the training dtype on the rank's device,
SDPA attention, a 16-bit loss without a full-vocabulary fp32 copy, and `model.pretrained_path` giving
the same logits under ZeRO-0 and ZeRO-3 (transformers' DeepSpeed integration, on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

os.environ.setdefault("DS_ACCELERATOR", "cpu")

SMALL = [
    "cluster=local",
    "gpus_per_node=0",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_dim=128",
    "model.num_heads=4",
]


def _cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema, validation

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=[*SMALL, *overrides])
    validation.validate_config(cfg, submitting=False)
    return cfg


def test_a_fresh_model_is_built_in_the_training_dtype_with_sdpa_attention():
    from slurmtrain.compute import model

    cfg = _cfg("deepspeed=zero2")
    fp32 = model.build(cfg, {"bf16": {"enabled": False}}, "cpu")
    bf16 = model.build(cfg, {"bf16": {"enabled": True}}, "cpu")
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}  # never an fp32 copy first
    assert fp32.config._attn_implementation == "sdpa"
    assert torch.get_default_dtype() == torch.float32  # restored
    # fp32 on CPU: the very weights the constructor gave before (same generator, same order).
    from transformers import OPTForCausalLM

    torch.manual_seed(cfg.train.seed)
    plain = OPTForCausalLM(model.opt_config(cfg))
    for a, b in zip(fp32.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)


def test_the_16bit_loss_matches_an_fp32_cross_entropy_and_its_gradient(monkeypatch):
    from slurmtrain.compute import model

    monkeypatch.setattr(model, "LOSS_CHUNK_TOKENS", 7)  # several chunks and a ragged last one
    torch.manual_seed(0)
    logits = (torch.randn(3, 10, 50) * 3).to(torch.bfloat16).requires_grad_()
    window = torch.randint(0, 50, (3, 11))

    class Fake(torch.nn.Module):
        def forward(self, input_ids):
            return type("Out", (), {"logits": logits})

    loss = model.loss_fn(Fake(), window)
    loss.backward()
    ref_logits = logits.detach().float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_logits.reshape(-1, 50), window[:, 1:].reshape(-1))
    ref.backward()
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref.item()) < 1e-5
    assert torch.allclose(logits.grad.float(), ref_logits.grad.to(torch.bfloat16).float())


def test_fp32_loss_is_the_plain_cross_entropy():
    from slurmtrain.compute import model

    torch.manual_seed(1)
    logits = torch.randn(2, 9, 30)
    window = torch.randint(0, 30, (2, 10))

    class Fake(torch.nn.Module):
        def forward(self, input_ids):
            return type("Out", (), {"logits": logits})

    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), window[:, 1:].reshape(-1))
    assert torch.equal(model.loss_fn(Fake(), window), ref)  # bitwise: resume tests rely on it


_LOGITS = r"""
import json, os, sys
import torch
import deepspeed
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
from hydra import compose, initialize_config_dir
from slurmtrain.common import ds_config, schema
from slurmtrain.compute import model
stage, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
deepspeed.init_distributed(dist_backend="gloo", verbose=False)
schema.register()
with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
    cfg = compose("config", overrides=json.loads(os.environ["OVERRIDES"]) + [
        f"deepspeed=zero{stage}", f"model.pretrained_path={folder}"])
from slurmtrain.common.validation import resolve_batch
resolve_batch(cfg)
ds = ds_config.build(cfg, int(os.environ["WORLD_SIZE"]))
net = model.build(cfg, ds, "cpu")
engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds)
engine.eval()
ids = torch.arange(24).reshape(2, 12) % 60
with torch.no_grad():
    logits = engine(input_ids=ids).logits
if int(os.environ["RANK"]) == 0:
    torch.save(logits, out)
engine.destroy()
torch.distributed.destroy_process_group()
"""


def _logits(stage: int, folder: Path, out: Path, world: int) -> torch.Tensor:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            DS_ACCELERATOR="cpu",
            PYTHONWARNINGS="ignore",
            PYTHONPATH=str(ROOT),
            OVERRIDES=json.dumps(
                SMALL
                + ["train.global_batch_size=2", "train.micro_batch_size=1", "train.max_steps=1"]
            ),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _LOGITS, str(stage), str(folder), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return torch.load(out)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A local OPT folder with non-default weights (so a skipped load cannot pass)."""
    from transformers import OPTForCausalLM

    from slurmtrain.compute import model

    folder = tmp_path_factory.mktemp("pretrained") / "opt"
    torch.manual_seed(123)
    net = OPTForCausalLM(model.opt_config(_cfg()))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    net.save_pretrained(str(folder))
    return folder


def test_pretrained_folder_gives_the_same_logits_under_zero0_and_zero3(pretrained, tmp_path):
    from transformers import OPTForCausalLM

    ref = OPTForCausalLM.from_pretrained(str(pretrained), local_files_only=True).eval()
    ids = torch.arange(24).reshape(2, 12) % 60
    with torch.no_grad():
        expected = ref(input_ids=ids).logits
    z0 = _logits(0, pretrained, tmp_path / "z0.pt", 1)
    z3 = _logits(3, pretrained, tmp_path / "z3.pt", 2)
    assert torch.equal(z0, expected)
    diff = (z3 - z0).abs().max().item()
    print(f"pretrained logits: ZeRO-3 (2 ranks) vs ZeRO-0 max |diff| {diff:.1e}")
    assert diff <= 1e-5
