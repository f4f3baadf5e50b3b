"""`model=hf model.config=DIR_OR_JSON`: a local Hugging Face config read into the `model` keys.

On the login node, before anything is planned: transformers' own config class of the file's
model_type (AutoConfig, imported here only when model=hf is asked for: nothing is downloaded) gives
every value, the class defaults included (Llama unties its lm_head by default, GPT-2 ties it). The
shape the planner reads goes into model.* (family = model_type, num_layers, hidden_size, num_heads,
num_kv_heads, ffn_dim, vocab_size, max_positions, tie_embeddings, init_std), the rest of what the
file sets into model.hf_extra. config.yaml then holds the whole architecture (the compute nodes
never read the user's folder, which may change) and the fingerprint hashes it, not the path.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Union

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import ModelConfig, RootConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# transformers' standard attribute -> model.* key (every config class answers these names, through
# its attribute_map where it stores them under its own, e.g. GPT-2's n_layer).
STANDARD = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_heads",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_positions",
    "tie_word_embeddings": "tie_embeddings",
}
FFN_NAMES = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
# What config.json carries that is not architecture (or is set by slurmtrain itself).
BOOKKEEPING = {
    "model_type",
    "architectures",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "_name_or_path",
    "use_cache",
    "attn_implementation",
    "_attn_implementation_autoset",
    "num_key_value_heads",
    "initializer_range",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
}
EXAMPLE = "e.g. model=hf model.config=~/models/my-llama (a folder with config.json)"


def source_file(value: str) -> Path:
    path = Path(os.path.expanduser(value)).resolve()
    found = path / "config.json" if path.is_dir() else path
    if not found.is_file():
        raise ConfigError(
            f"model.config={value}: no config.json there; point it at a local folder with "
            f"config.json or at a .json file (nothing is downloaded); {EXAMPLE}"
        )
    return found


def read(value: str) -> dict[str, object]:
    found = source_file(value)
    try:
        data: object = json.loads(found.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.config={found}: not a JSON config ({err}); {EXAMPLE}") from None
    if not isinstance(data, dict) or not data.get("model_type"):
        raise ConfigError(
            f"model.config={found}: has no model_type; add the family it is, e.g. "
            f'"model_type": "llama"'
        )
    return data


def model_keys(data: dict[str, object]) -> dict[str, object]:
    """The `model` keys of a config.json: the shape by transformers' class, the rest hf_extra."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    family = str(data["model_type"])
    if family not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        known = ", ".join(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)[:8])
        raise ConfigError(
            f"model.config: model_type={family!r} is not a causal LM this transformers ships "
            f"({known}, ...); use a decoder's config.json"
        )
    body = {k: v for k, v in data.items() if k != "model_type"}
    try:
        config = AutoConfig.for_model(family, **body)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"model.config: transformers refuses this {family} config: {err}"
        ) from None
    out: dict[str, object] = {"family": family}
    for attribute, key in STANDARD.items():
        out[key] = getattr(config, attribute, None)
    ffn = next((getattr(config, n) for n in FFN_NAMES if getattr(config, n, None)), None)
    out["ffn_dim"] = int(ffn or 4 * config.hidden_size)
    out["num_kv_heads"] = getattr(config, "num_key_value_heads", None)
    out["init_std"] = float(getattr(config, "initializer_range", None) or 0.02)
    out["tie_embeddings"] = bool(out["tie_embeddings"])
    missing = [k for k, v in out.items() if v is None and k != "num_kv_heads"]
    if missing:
        raise ConfigError(f"model.config: the {family} config gives no {missing[0]}; set it there")
    if family == "opt":  # OPT builds through opt_config, which reads these two from model.*
        e = config.word_embed_proj_dim
        out["word_embed_proj_dim"] = e if e and e != out["hidden_size"] else None
        out["layer_norm_before"] = bool(config.do_layer_norm_before)
    # Everything the file sets beyond the shape, under the class's own names (aliases dropped;
    # another family's own FFN name, GPT-2's n_inner, stays: it is what its class reads).
    aliases = {config.attribute_map.get(a, a) for a in STANDARD} | set(STANDARD)
    drop = BOOKKEEPING | aliases | {"intermediate_size", "word_embed_proj_dim"}
    drop |= {"ffn_dim", "do_layer_norm_before"} if family == "opt" else set()
    out["hf_extra"] = {k: v for k, v in body.items() if k not in drop}
    return out


def resolve(cfg: RootConfig) -> None:
    """model.family=hf (model=hf): the config read into cfg.model; other families: nothing."""
    m = cfg.model
    if m.family != "hf":
        if m.config:
            raise ConfigError(
                f"model.config={m.config}: read only with model=hf (this is "
                f"model={m.name}); use model=hf model.config={m.config}"
            )
        return
    source = m.config or m.pretrained_path
    if not source:
        raise ConfigError(f"model=hf: needs model.config=DIR_OR_JSON; {EXAMPLE}")
    keys = model_keys(read(str(source)))
    read_extra = keys["hf_extra"]
    assert isinstance(read_extra, dict)
    keys["hf_extra"] = {**read_extra, **_plain_dict(m.hf_extra)}
    for key, value in keys.items():
        setattr(m, key, value)
    if m.name == "hf":  # the family, not the folder: a moved folder is the same model
        m.name = f"hf_{keys['family']}"
    m.config = str(source_file(str(source)))


def _plain_dict(value: object) -> dict[str, object]:
    """model.hf_extra as a plain dict: a DictConfig (login side) or a dict (compute side)."""
    data = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def family_config(model: Union[ModelConfig, Mapping[str, object]]) -> PretrainedConfig:
    """Any other family's transformers config from the `model` keys (cfg.model or a plain dict):
    the shape keys under transformers' standard names, over model.hf_extra's own keys."""
    from transformers import AutoConfig

    m = dataclasses.asdict(model) if isinstance(model, ModelConfig) else model
    extra = _plain_dict(m.get("hf_extra"))
    keys = dict(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden_size"],
        num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"],
        intermediate_size=m["ffn_dim"],
        max_position_embeddings=m["max_positions"],
        num_key_value_heads=m.get("num_kv_heads") or m["num_heads"],
        tie_word_embeddings=bool(m.get("tie_embeddings", True)),
        initializer_range=m.get("init_std", 0.02),
        use_cache=False,
        attn_implementation="sdpa",  # pinned, as for OPT
    )
    if m.get("dropout"):
        keys["attention_dropout"] = m["dropout"]
    return AutoConfig.for_model(m["family"], **{**extra, **keys})
