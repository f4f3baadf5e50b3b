"""`model=hf model.config=DIR_OR_JSON`: a local Hugging Face config, trained as transformers wrote it.

Login node, before anything is planned: the file's model_type names its config class (AutoConfig,
imported here only when model=hf is asked for: nothing is downloaded), which gives every value,
the class defaults included (Llama unties its lm_head by default, GPT-2 ties it). The shape the
planner reads goes into model.* (family = model_type, num_layers, hidden_size, num_heads,
num_kv_heads, ffn_dim, vocab_size, max_positions, tie_embeddings, init_std), the rest of what the
file sets (and the user's model.hf_extra over it) into model.hf_extra: config.yaml holds the whole
architecture and the fingerprint hashes it, not the path. A family transformers ships that
slurmtrain cannot train is refused here in one line naming the family and why (`refusal`), and so
is a config its class refuses or cannot build on the meta device (the planner builds it there).

At submit the file is copied into the run directory (RUN_COPY; config.yaml's model.config names
it, relative to the run directory), and the compute side builds from that copy: the file's own
JSON values, typed as transformers types them (a token id stays an int), with only the user's
overrides (model.hf_extra keys that differ from the file, shape keys changed there) and
slurmtrain's own settings (attention, use_cache, dropout) over it. Compute nodes never read the
user's folder, which may change.

Attention (model.attn_implementation): auto is SDPA where the family's class supports it
(`_supports_sdpa`), else eager (gemma2's soft-capping, bloom's ALiBi); sdpa, eager and
flash_attention_2 are taken as asked where the class supports them, else refused at login.
ALiBi families (bloom, mpt) have no position table: they plan with data.seq_len.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Union

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import ModelConfig, RootConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

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
RUN_COPY = "model_config.json"  # the run directory's copy of the model's config.json
ATTENTION = ("auto", "sdpa", "eager", "flash_attention_2")
# Families whose classes take SDPA, known without importing transformers (the shipped configs).
SDPA_FAMILIES = {"opt", "llama", "mistral", "qwen2"}
# Positions by ALiBi (attention biases): no position table, any length; planned on data.seq_len.
ALIBI = {"bloom", "mpt"}
# Families transformers maps to a causal LM that slurmtrain does not train, and why (one line each;
# docs/models.md's family table lists them). Encoders used as decoders and the decoder halves of
# encoder-decoders are found by transformers' own mappings (`refusal`).
REFUSED = {
    "mamba": "a state-space model (no attention heads to plan)",
    "mamba2": "a state-space model (no attention heads to plan)",
    "falcon_mamba": "a state-space model (no attention heads to plan)",
    "rwkv": "a recurrent model (no attention heads to plan)",
    "xlstm": "a recurrent model (no attention heads to plan)",
}


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


def refusal(family: str) -> Optional[str]:
    """Why slurmtrain does not train this model_type (None: it does, or tries at login)."""
    from transformers.models.auto import modeling_auto as auto

    causal = auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if family not in causal:
        return None  # model_keys says it is not a causal LM at all
    name = str(causal[family])
    seq2seq = {**auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}
    seq2seq.update(auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)
    if family in REFUSED:
        return REFUSED[family]
    if "CausalLM" not in name and "LMHead" not in name:
        return f"{name} is not a text decoder (multimodal or generation wrapper)"
    if family in seq2seq:
        return f"{name} is the decoder half of an encoder-decoder model"
    if family in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES or name.endswith("Decoder"):
        return f"{name} is an encoder used as a decoder (cross-attention, is_decoder)"
    return None


def _refuse(
    family: str, why: str, fix: str = "use a decoder-only family (llama, qwen2, ...)"
) -> ConfigError:
    return ConfigError(f"model.config: {family} is not trained by slurmtrain: {why}; {fix}")


def config_class(family: str) -> type[PretrainedConfig]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls: type[PretrainedConfig] = CONFIG_MAPPING[family]
    return cls


def typed(family: str, key: str, value: object) -> object:
    """A user's value for `key` as the family's class types it: an int where the class holds a
    float (rope_theta=500000 from the command line) becomes that float; the rest as given."""
    default = _defaults(family).get(key)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@functools.lru_cache(maxsize=8)
def _defaults(family: str) -> dict[str, object]:
    """The family's config class's default values (to_dict: its own names)."""
    return dict(config_class(family)().to_dict())


def transformers_config(family: str, body: Mapping[str, object]) -> PretrainedConfig:
    """`body` (config.json's keys without model_type) in the family's config class; refused in
    one line when the class refuses it."""
    from transformers import AutoConfig, PretrainedConfig

    # config.json's encoded floats ({"__float__": "Infinity"}) decoded as from_pretrained does
    decoded = PretrainedConfig._decode_special_floats(dict(body))
    try:
        config: PretrainedConfig = AutoConfig.for_model(family, **decoded)
    except Exception as err:  # strict dataclass validation raises its own types
        raise ConfigError(
            f"model.config: transformers refuses this {family} config: {_one_line(err)}; fix "
            f"the key it names in config.json or override it with model.hf_extra.KEY=VALUE"
        ) from None
    return config


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def model_keys(data: dict[str, object], seq_len: Optional[int] = None) -> dict[str, object]:
    """The `model` keys of a config.json (the user's hf_extra already over it): the shape by
    transformers' class, the rest hf_extra. `seq_len`: an ALiBi family's planned positions."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    family = str(data["model_type"])
    if family not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        known = ", ".join(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)[:8])
        raise ConfigError(
            f"model.config: model_type={family!r} is not a causal LM this transformers ships "
            f"({known}, ...); use a decoder's config.json"
        )
    why = refusal(family)
    if why:
        raise _refuse(family, why)
    body = {k: v for k, v in data.items() if k != "model_type"}
    config = transformers_config(family, body)
    out: dict[str, object] = {"family": family}
    for attribute, key in STANDARD.items():
        out[key] = getattr(config, attribute, None)
    if out["max_positions"] is None and (family in ALIBI or getattr(config, "alibi", False)):
        out["max_positions"] = seq_len  # no position table: the sequences it is trained on
    ffn = next((getattr(config, n) for n in FFN_NAMES if getattr(config, n, None)), None)
    hidden = out["hidden_size"]
    out["ffn_dim"] = int(ffn) if ffn else (4 * hidden if isinstance(hidden, int) else None)
    out["num_kv_heads"] = getattr(config, "num_key_value_heads", None)
    out["init_std"] = float(getattr(config, "initializer_range", None) or 0.02)
    out["tie_embeddings"] = bool(out["tie_embeddings"])
    missing = [k for k, v in out.items() if v is None and k != "num_kv_heads"]
    if missing:
        raise _refuse(
            family,
            f"its config gives no {missing[0]} (a shape slurmtrain plans with)",
            "set it in config.json (model.hf_extra.KEY=VALUE) or use another family",
        )
    pad = getattr(config, "pad_token_id", None)
    vocab = out["vocab_size"]
    if isinstance(pad, int) and isinstance(vocab, int) and not 0 <= pad < vocab:
        raise ConfigError(
            f"model.hf_extra.pad_token_id={pad}: outside the vocabulary (vocab_size={vocab}); "
            f"set model.hf_extra.pad_token_id=null or an id below {vocab}"
        )
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
    gpus = cfg.gpus_per_node if isinstance(cfg.gpus_per_node, int) else None
    if m.family != "hf":
        if m.config:
            raise ConfigError(
                f"model.config={m.config}: read only with model=hf (this is "
                f"model={m.name}); use model=hf model.config={m.config}"
            )
        _flash_attn_installed(attention(m, gpus), str(cfg.cluster.container))
        return  # refused here, in one line, not on the compute node
    source = m.config or m.pretrained_path
    if not source:
        raise ConfigError(f"model=hf: needs model.config=DIR_OR_JSON; {EXAMPLE}")
    data = read(str(source))
    family = str(data["model_type"])
    user = _plain_dict(m.hf_extra)
    if "model_type" in user:
        raise ConfigError(
            "model.hf_extra.model_type: the family is config.json's model_type; point "
            "model.config at another family's config.json instead"
        )
    if user and family in _causal_families():
        user = {k: typed(family, k, v) for k, v in user.items()}
    keys = model_keys({**data, **user}, seq_len=cfg.data.seq_len)
    for key, value in keys.items():
        setattr(m, key, value)
    if m.name == "hf":  # the family, not the folder: a moved folder is the same model
        m.name = f"hf_{keys['family']}"
    m.config = str(source_file(str(source)))
    _flash_attn_installed(attention(m, gpus), str(cfg.cluster.container))


def _flash_attn_installed(attn: str, container: str) -> None:
    """flash_attention_2 needs the flash_attn package where the ranks run: without a container
    that is this Python (its venv), so a missing package is refused here, not after the queue
    wait; an image is checked by `slurmtrain doctor --container KIND --image IMAGE`."""
    import importlib.util

    if attn == "flash_attention_2" and container == "none":
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                "model.attn_implementation=flash_attention_2: the flash_attn package is not "
                "installed in this Python, which the ranks run (pip install flash-attn "
                "--no-build-isolation), or use model.attn_implementation=sdpa"
            )


def _causal_families() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _plain_dict(value: object) -> dict[str, object]:
    """model.hf_extra as a plain dict: a DictConfig (login side) or a dict (compute side)."""
    data = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


# -- attention ------------------------------------------------------------------------------------


def check_attention_name(value: str) -> None:
    if value not in ATTENTION:
        raise ConfigError(
            f"model.attn_implementation={value!r}: not one of {', '.join(ATTENTION)}; e.g. "
            f"model.attn_implementation=auto (SDPA where the family supports it, else eager)"
        )


def causal_lm_class(family: str) -> type[PreTrainedModel]:
    """The ...ForCausalLM class transformers maps `family` to."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls: type[PreTrainedModel] = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family])
    return cls


def attention(model: Union[ModelConfig, Mapping[str, object]], gpus: Optional[int] = None) -> str:
    """The attention implementation the model trains with (model.attn_implementation resolved:
    auto is SDPA where the family's class supports it, else eager). A choice the class cannot
    take (or flash_attention_2 on CPU ranks, `gpus`=0) is refused in one line."""
    m = dataclasses.asdict(model) if isinstance(model, ModelConfig) else model
    asked = str(m.get("attn_implementation") or "auto")
    family = str(m.get("family") or "opt")
    check_attention_name(asked)
    if asked == "eager" or (asked in ("auto", "sdpa") and family in SDPA_FAMILIES):
        return "sdpa" if asked == "auto" else asked
    if asked == "flash_attention_2" and gpus == 0:
        raise ConfigError(
            "model.attn_implementation=flash_attention_2: needs GPUs (gpus_per_node=0 trains on "
            "CPU ranks); use model.attn_implementation=auto"
        )
    if family not in _causal_families():
        return "sdpa" if asked == "auto" else asked  # validation refuses the family itself
    cls = causal_lm_class(family)
    sdpa = bool(getattr(cls, "_supports_sdpa", False))
    if asked == "auto":
        return "sdpa" if sdpa else "eager"
    supported = sdpa if asked == "sdpa" else bool(getattr(cls, "_supports_flash_attn", False))
    if not supported:
        raise ConfigError(
            f"model.attn_implementation={asked}: {family} ({cls.__name__}) does not support it; "
            f"use model.attn_implementation=auto (it picks "
            f"{'sdpa' if sdpa else 'eager'} for {family}) or eager"
        )
    return asked


# -- the transformers config the model is built from ----------------------------------------------


def family_config(
    model: Union[ModelConfig, Mapping[str, object]], attn: Optional[str] = None
) -> PretrainedConfig:
    """The family's transformers config from the `model` keys (cfg.model or a plain dict). With a
    model.config file (model=hf): that file's own values (from_file); else (the shipped configs)
    the shape keys under transformers' standard names over model.hf_extra's own keys. `attn`:
    the attention implementation (default: `attention(model)`)."""
    m = dataclasses.asdict(model) if isinstance(model, ModelConfig) else dict(model)
    attn = attn or attention(m)
    source = m.get("config")
    if source and Path(str(source)).is_file():
        return from_file(m, Path(str(source)), attn)
    from transformers import AutoConfig

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
        attn_implementation=attn,
    )
    if m.get("dropout"):
        keys["attention_dropout"] = m["dropout"]
    config: PretrainedConfig = AutoConfig.for_model(m["family"], **{**extra, **keys})
    return config


def from_file(m: Mapping[str, object], path: Path, attn: str) -> PretrainedConfig:
    """config.json as transformers wrote it (its JSON types), with only what the `model` keys
    change over it: model.hf_extra keys whose value differs from the file's (the user's
    overrides, typed as the class types them), shape keys that differ, and slurmtrain's own
    settings (attention, no KV cache, dropout)."""
    data = json.loads(path.read_text())
    family = str(data.pop("model_type"))
    if family != m.get("family"):
        raise ConfigError(
            f"model.config={path}: model_type={family!r} but model.family={m.get('family')!r}; "
            f"submit again with model=hf model.config=DIR"
        )
    for key, value in _plain_dict(m.get("hf_extra")).items():
        if key not in data or data[key] != value:
            data[key] = typed(family, key, value)
    data.update(use_cache=False, attn_implementation=attn)
    if m.get("dropout"):
        data["attention_dropout"] = m["dropout"]
    config = transformers_config(family, data)
    changed = {a: m.get(k) for a, k in STANDARD.items()}
    changed.update(num_key_value_heads=m.get("num_kv_heads"), initializer_range=m.get("init_std"))
    for attribute, value in changed.items():
        theirs = getattr(config, attribute, None)
        if value is not None and theirs is not None and theirs != value:
            setattr(config, attribute, value)  # through the class's attribute_map (n_layer)
    return config
