"""Issue 33: configs as transformers writes them, family by family, through the path a job takes.

Each family's tiny config is written by transformers' own config class and `save_pretrained` (token
ids and all), then: composed with `model=hf model.config=DIR`, planned (the meta-device build),
recorded as a submission records it (config.yaml + the run directory's copy of config.json), read
back as the compute side reads it (schema.load_run_config), built (compute/model.py), trained a
few AdamW steps, exported as `cli export` writes a folder, and loaded by transformers as the same
class with the same logits. One process, a few seconds a family.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmtrain.common import rundir, schema, secrets
from slurmtrain.common.errors import ConfigError

# The families the issue names, each trained here; MoE families plan on total and active params.
FAMILIES = [
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "gpt_neox",
    "falcon",
    "gpt2",
    "olmo2",
    "starcoder2",
    "bloom",
]
SMALL = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    intermediate_size=128,
    max_position_embeddings=256,
    head_dim=16,
    n_inner=128,
    ffn_hidden_size=128,
    num_local_experts=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
)
SEQ_LEN = 32


def tiny_config(family: str, folder: Path, **more: Any) -> Path:
    """A tiny config.json of `family` written by transformers (its class's defaults for the rest;
    token ids above the tiny vocabulary moved into it, as a real tokenizer's would be)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    default = cls()
    kwargs: dict[str, Any] = {}
    for key, value in SMALL.items():
        if hasattr(default, key) and not isinstance(getattr(cls, key, None), property):
            kwargs[cls.attribute_map.get(key, key)] = value
    for i, key in enumerate(("bos_token_id", "eos_token_id", "pad_token_id")):
        given = getattr(default, key, None)
        if isinstance(given, int) and given >= SMALL["vocab_size"]:
            kwargs[key] = i + 1
    kwargs.update(more)
    cls(**kwargs).save_pretrained(str(folder))
    return folder


def compose(tmp_path: Path, *overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from slurmtrain.login.prepare import resolve

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = hydra_compose(
            "config",
            overrides=[
                f"runs_root={tmp_path / 'runs'}",
                "cluster=local",
                "gpus_per_node=0",
                f"data.seq_len={SEQ_LEN}",
                *overrides,
            ],
        )
    return resolve(cfg)


def submitted(tmp_path: Path, folder: Path, *overrides: str) -> tuple[Path, str]:
    """Compose, plan and record as a submission does; (run directory, the plan's text)."""
    from slurmtrain.login.prepare import typed
    from slurmtrain.planning import preflight

    cfg = compose(tmp_path, "model=hf", f"model.config={folder}", *overrides)
    plan = preflight.report(typed(cfg)).text
    data = secrets.referenced(schema.plain(cfg))  # login/prepare.py: what config.yaml records
    run = rundir.locate(cfg, data)
    rundir.create(run, cfg, [], durable=False, data=data)
    return run.path, plan


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("SLURMTRAIN_AUTO", "off")
    return tmp_path_factory.mktemp("families")


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_from_its_own_config_json_and_exports(family, workdir):
    from transformers import AutoModelForCausalLM

    from slurmtrain.compute import model
    from slurmtrain.compute.export import write_folder

    home = workdir / family
    folder = tiny_config(family, home / "src")
    written = json.loads((folder / "config.json").read_text())
    run, plan = submitted(home, folder)
    assert f"plan: hf_{family} (" in plan, plan
    text = (run / "config.yaml").read_text()
    assert "oc.env" not in text, text  # no model key is a secret
    copy = run / "model_config.json"
    assert json.loads(copy.read_text()) == written  # compute nodes never read the source folder

    cfg = schema.load_run_config(str(run / "config.yaml"))  # as the compute side reads it
    assert cfg.model.config == str(copy)
    config = model.model_config(cfg)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # typed as transformers wrote
        if key in written:
            assert getattr(config, key) == written[key], key
    torch.manual_seed(0)
    net = model.build(cfg, {}, "cpu")
    assert type(net) is model.model_class(cfg)
    want_attn = "eager" if family in ("gemma2", "bloom") else "sdpa"
    assert net.config._attn_implementation == want_attn
    batch = torch.randint(0, 256, (4, SEQ_LEN + 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net.train()
    losses = []
    for _ in range(3):
        loss = model.loss_fn(net, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses

    out = home / "export"
    out.mkdir()
    write_folder(cfg, dict(net.state_dict()), out, torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    assert type(loaded) is type(net)
    net.eval()
    with torch.no_grad():
        want = net(input_ids=batch[:, :-1]).logits
        got = loaded(input_ids=batch[:, :-1]).logits
    assert float((want - got).abs().max()) <= 1e-5


def test_moe_plans_memory_on_total_and_flops_on_active_parameters(workdir):
    from slurmtrain.common.hf_config import family_config
    from slurmtrain.planning import shapes

    folder = tiny_config("mixtral", workdir / "moe" / "src")
    cfg = compose(workdir / "moe", "model=hf", f"model.config={folder}")
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        net = AutoModelForCausalLM.from_config(family_config(cfg.model))
    total = net.num_parameters()
    assert shapes.param_count(cfg.model) == total
    experts = 4 * 2 * 3 * 64 * 128  # experts x layers x (gate, up, down) x h x ffn
    assert shapes.active_params(cfg.model) == total - experts // 2  # 2 of 4 experts per token


@pytest.mark.parametrize(
    "family,more,says",
    [
        ("llama", {"pad_token_id": 600}, "model.hf_extra.pad_token_id=600: outside the vocab"),
        ("mamba", {}, "mamba is not trained by slurmtrain: a state-space model"),
        ("bert", {"is_decoder": True}, "bert is not trained by slurmtrain: BertLMHeadModel is an"),
        ("marian", {}, "marian is not trained by slurmtrain: MarianForCausalLM is the decoder"),
    ],
)
def test_a_family_or_config_slurmtrain_cannot_train_is_refused_in_one_line(
    family, more, says, workdir
):
    folder = tiny_config(family, workdir / f"refused_{family}", **more)
    with pytest.raises(ConfigError) as err:
        compose(workdir, "model=hf", f"model.config={folder}")
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "family,overrides,says",
    [
        ("bloom", ["model.attn_implementation=sdpa"], "bloom (BloomForCausalLM) does not supp"),
        ("llama", ["model.attn_implementation=flash"], "model.attn_implementation='flash': not"),
        (  # GPU ranks without a container run this Python: flash_attn must be in it
            "llama",
            ["model.attn_implementation=flash_attention_2", "gpus_per_node=8"],
            "the flash_attn package is not installed",
        ),
        ("llama", ["+model.hf_extra.num_key_value_heads=3"], "model.num_kv_heads=3: must divide"),
        ("gemma", ["+model.hf_extra.hidden_act=swishy"], "cannot build this gemma model"),
        ("phi3", ["+model.hf_extra.rope_parameters=7"], "transformers refuses this phi3 config"),
    ],
)
def test_build_errors_at_login_are_one_line(family, overrides, says, workdir):
    from slurmtrain.login.prepare import typed
    from slurmtrain.planning import preflight

    folder = tiny_config(family, workdir / f"bad_{family}_{len(says)}")
    with pytest.raises(ConfigError) as err:
        cfg = compose(workdir, "model=hf", f"model.config={folder}", *overrides)
        preflight.report(typed(cfg))
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)
