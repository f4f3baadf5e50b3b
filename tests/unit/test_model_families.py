"""Beyond OPT: every shipped model config's planner counts equal the model transformers
builds from it (on the meta device: no memory), FLOPs of the gated/GQA families, model=hf from a
local folder, and the Llama-style recipe."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import ds_config, schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import fingerprint
from slurmtrain.planning import preflight, shapes
from slurmtrain.planning.flops import flops_per_token, matmul_params
from slurmtrain.planning.memory import plan_memory
from tests.plans import plan_line, planned

schema.register()
SHIPPED = shapes.shipped()


def _built(shape):
    """transformers' model of `shape` on the meta device (as compute/model.py builds it)."""
    torch = pytest.importorskip("torch")
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, OPTForCausalLM

    from slurmtrain.common.hf_config import family_config
    from slurmtrain.compute.model import opt_config

    view = json.loads(shapes._spec(shape))
    with torch.device("meta"):
        if view["family"] == "opt":
            fields = {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)}
            model = OmegaConf.create({"model": {**fields, "dropout": 0.0, "init_std": 0.02}})
            return OPTForCausalLM(opt_config(model))
        return AutoModelForCausalLM.from_config(family_config(view))


def test_every_family_is_shipped():
    families = {s.family for s in SHIPPED.values()}
    assert {"opt", "llama", "mistral", "qwen2"} <= families
    assert {"llama_tiny", "qwen2_tiny", "llama3_8b", "mistral_7b"} <= set(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_planner_counts_equal_the_built_model_for_every_shipped_config(name):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch = pytest.importorskip("torch")
    from deepspeed.runtime.zero.stage3 import model_to_params

    shape = SHIPPED[name]
    model = _built(shape)
    assert shapes.param_count(shape) == model.num_parameters()
    _, largest = model_to_params(model)  # DeepSpeed's (its total dedups by data_ptr: 0 on meta)
    assert shapes.largest_layer_params(shape) == largest
    sizes = sorted(p.numel() for p in model.parameters())
    assert sorted(shapes.tensor_sizes(shape)) == sizes
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_params(shape) == linear  # q k v o + MLP + lm_head (tied or not)


@pytest.mark.parametrize("tied", [True, False])
def test_llama_tiny_ties_or_unties_its_head_by_a_key(tied):
    shape = dataclasses.replace(SHIPPED["llama_tiny"], tie_embeddings=tied)
    model = _built(shape)
    assert shapes.param_count(shape) == model.num_parameters()
    head = shape.vocab_size * shape.hidden_size
    untied = dataclasses.replace(shape, tie_embeddings=False)
    assert shapes.param_count(untied) - shapes.param_count(shape) == (0 if not tied else head)


def test_published_sizes_of_the_planning_configs():
    assert shapes.param_count(SHIPPED["llama3_8b"]) == 8_030_261_248  # Meta-Llama-3-8B
    assert shapes.param_count(SHIPPED["mistral_7b"]) == pytest.approx(7.248e9, rel=1e-3)


def test_gqa_shrinks_only_k_and_v_and_the_attention_term_counts_query_heads():
    mha = dataclasses.replace(SHIPPED["llama3_8b"], num_kv_heads=None)
    gqa, mqa = SHIPPED["llama3_8b"], dataclasses.replace(mha, num_kv_heads=1)
    h, L, d = 4096, 32, 128
    assert matmul_params(mha) - matmul_params(gqa) == L * 2 * h * (32 - 8) * d
    assert matmul_params(mha) - matmul_params(mqa) == L * 2 * h * 31 * d
    s = 8192
    attention = 12 * L * h * s  # q.k^T and the weighted sum over 32 query heads x 128
    assert flops_per_token(gqa, s) == 6 * matmul_params(gqa) + attention
    assert matmul_params(gqa) == L * (2 * h * h + 2 * h * 8 * d + 3 * h * 14336) + 128256 * h


def test_gated_activations_count_three_ffn_matrices():
    tiny = SHIPPED["llama_tiny"]
    h, f, q, kv = 64, tiny.ffn_dim, 64, 32
    plan = plan_memory(tiny, micro_batch=1, seq_len=128, dtype="bf16", device="cpu")
    per_layer = (4 * h + 2 * h + 4 * q + 4 * kv + 2 * h + 8 * f) * 128
    assert plan.activations == 2 * per_layer + 128 * 512 * (2 + 4 + 4)


def test_any_other_family_is_counted_on_the_meta_device():
    gpt_neox = shapes.Shape(
        "neox",
        2,
        64,
        4,
        256,
        vocab_size=512,
        max_positions=512,
        family="gpt_neox",
        tie_embeddings=False,
    )
    model = _built(gpt_neox)
    assert shapes.param_count(gpt_neox) == model.num_parameters()
    assert plan_memory(gpt_neox, device="cpu", seq_len=128).num_params == model.num_parameters()


def test_opt_sizes_are_read_from_the_yaml_files():
    assert list(shapes.OPT_SIZES) == [
        "opt125m",
        "opt350m",
        "opt1.3b",
        "opt2.7b",
        "opt6.7b",
        "opt13b",
        "opt30b",
        "opt66b",
    ]
    assert shapes.OPT_SIZES["opt350m"].word_embed_proj_dim == 512


# -- model=hf: a local folder ---------------------------------------------------------------------

LLAMA_JSON = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "initializer_range": 0.02,
}


def _resolved(tmp_path, *overrides):
    from slurmtrain.login.prepare import resolve

    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"runs_root={tmp_path}", "cluster=local", "gpus_per_node=0", *overrides],
        )
    return resolve(cfg)


def test_model_hf_reads_a_local_folder_and_the_fingerprint_hashes_its_contents(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps(LLAMA_JSON))
    cfg = _resolved(tmp_path, "model=hf", f"model.config={tmp_path / 'a'}")
    m = cfg.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads) == (
        "llama",
        2,
        64,
        4,
        2,
    )
    assert (m.ffn_dim, m.vocab_size, m.max_positions, m.tie_embeddings) == (176, 512, 512, False)
    assert m.hf_extra["rms_norm_eps"] == 1e-5 and "architectures" not in m.hf_extra
    assert shapes.param_count(m) == shapes.param_count(SHIPPED["llama_tiny"])
    moved = _resolved(tmp_path, "model=hf", f"model.config={tmp_path / 'b' / 'config.json'}")
    assert fingerprint(moved) == fingerprint(cfg)  # the contents, not where they lie


@pytest.mark.parametrize(
    "overrides,says",
    [
        (["model=hf"], "model=hf: needs model.config=DIR_OR_JSON"),
        (
            ["model=hf", "model.config=/nonexistent/x"],
            "model.config=/nonexistent/x: no config.json",
        ),
        (["model=llama_tiny", "model.config=/tmp"], "read only with model=hf"),
        (["model=llama_tiny", "model.num_kv_heads=3"], "model.num_kv_heads=3: must divide"),
        (["model=llama_tiny", "model.family=vit"], "model.family='vit': not a causal LM"),
    ],
)
def test_bad_model_input_is_one_line_naming_the_key(tmp_path, overrides, says):
    with pytest.raises(ConfigError) as err:
        _resolved(tmp_path, *overrides)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_model_hf_refuses_a_config_that_is_not_a_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 64}))
    with pytest.raises(ConfigError, match="model_type='vit' is not a causal LM"):
        _resolved(tmp_path, "model=hf", f"model.config={tmp_path}")


# -- the Llama recipe and the 8B plan -------------------------------------------------------------


def test_llama_recipe_is_cosine_to_ten_percent_after_2000_warmup_steps(tmp_path):
    cfg = _resolved(tmp_path, "model=llama_tiny", "recipe=llama", "train.max_steps=10000")
    o = cfg.optim
    assert (o.beta1, o.beta2, o.weight_decay, o.grad_clip, o.warmup_steps, o.decay) == (
        0.9,
        0.95,
        0.1,
        1.0,
        2000,
        "cosine",
    )
    assert cfg.model.dropout == 0.0 and o.min_lr == pytest.approx(0.1 * o.lr)
    lr = [ds_config.lr_at(k, 1.0, 0.1, 2000, 10000, "cosine") for k in (1999, 5999, 9999)]
    assert lr == pytest.approx([1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)), 0.1])


@pytest.mark.usefixtures("no_slurm")
def test_llama3_8b_plan_on_two_h100_nodes_fits_and_prints_mfu_and_eta(tmp_path):
    cfg = planned(
        tmp_path,
        "model=llama3_8b",
        "recipe=llama",
        "nodes=2",
        "gpus_per_node=8",
        "cluster=slurm",
        "deepspeed=zero3",
        "data.seq_len=8192",
        "train.global_batch_tokens=4194304",
        "train.micro_batch_size=1",
        "train.tokens=2e10",
        "dry_run=true",
    )
    report = preflight.report(cfg)
    assert report.misfit is None, report.text
    assert "llama3_8b (8.03B params)" in report.lines[0], report.text
    assert plan_line(report, "plan: fits")
    assert "MFU" in plan_line(report, "plan: ETA")


def test_model_hf_reads_an_opt_config_into_the_opt_keys(tmp_path):
    opt350m = {"model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24}
    opt350m.update(num_attention_heads=16, word_embed_proj_dim=512, do_layer_norm_before=False)
    (tmp_path / "config.json").write_text(json.dumps(opt350m))
    cfg = _resolved(tmp_path, "model=hf", f"model.config={tmp_path}", "data.seq_len=128")
    assert (cfg.model.word_embed_proj_dim, cfg.model.layer_norm_before) == (512, False)
    assert shapes.param_count(cfg.model) == shapes.param_count(shapes.OPT_SIZES["opt350m"])


def test_model_hf_reads_the_pretrained_folder_when_no_config_is_given(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**LLAMA_JSON, "tie_word_embeddings": True}))
    (folder / "model.safetensors").write_bytes(b"weights")  # only checksummed on the login node
    cfg = _resolved(tmp_path, "model=hf", f"model.pretrained_path={folder}")
    assert (cfg.model.family, cfg.model.tie_embeddings, cfg.model.num_kv_heads) == (
        "llama",
        True,
        2,
    )
    assert cfg.model.pretrained_checksum


def test_model_hf_builds_another_family_with_its_own_names(tmp_path):
    """GPT-2 names its shape n_layer/n_embd/n_head/n_inner: read through transformers' class."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from slurmtrain.common.hf_config import family_config

    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_inner": 128}
    (tmp_path / "gpt2.json").write_text(json.dumps({**gpt2, "n_positions": 256, "vocab_size": 512}))
    cfg = _resolved(
        tmp_path, "model=hf", f"model.config={tmp_path / 'gpt2.json'}", "data.seq_len=128"
    )
    m = cfg.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_heads, m.max_positions) == (
        "gpt2",
        2,
        64,
        4,
        256,
    )
    assert m.tie_embeddings and m.ffn_dim == 128 and "n_layer" not in m.hf_extra
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(family_config(m))
    assert (model.config.n_layer, model.config.n_positions, model.config.n_inner) == (2, 256, 128)
    assert shapes.param_count(m) == model.num_parameters()


@pytest.mark.parametrize("name", ["llama_tiny", "qwen2_tiny"])
def test_flops_match_deepspeed_flops_profiler_on_the_tiny_families(name):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch = pytest.importorskip("torch")
    from deepspeed.profiling.flops_profiler import get_model_profile
    from transformers import AutoModelForCausalLM

    from slurmtrain.common.hf_config import family_config

    shape, b, s = SHIPPED[name], 2, 128
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(json.loads(shapes._spec(shape)))).eval()
    ids = torch.randint(0, shape.vocab_size, (b, s))
    _, fwd_macs, _ = get_model_profile(
        model,
        kwargs={"input_ids": ids},
        print_profile=False,
        detailed=False,
        as_string=False,
        warm_up=0,
    )
    assert 3 * 2 * fwd_macs == pytest.approx(flops_per_token(shape, s) * b * s, rel=0.02)
