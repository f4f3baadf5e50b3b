"""Model shapes and their parameters, module by module: what every planner (memory, FLOPs) reads.

Counted by arithmetic for the families slurmtrain ships configs for: OPT (learned positions,
LayerNorm with biases, fc1/fc2 MLP, tied lm_head) and the Llama-shaped decoders (llama, mistral,
qwen2: RMSNorm, RoPE, GQA/MQA key-value heads, a gated SwiGLU MLP, tied or untied lm_head; qwen2
adds q/k/v biases). Any other family transformers ships (a `model.config` folder) is counted by
building it on the meta device once (no memory, no weights; transformers imported only then).
Counts equal transformers' `num_parameters()` (a tied lm_head counted once); tests check every
shipped config and DeepSpeed's own counter. Mixture-of-experts families (mixtral, qwen2_moe, ...):
memory is planned on all parameters, FLOPs on the active ones (`active_params`, `matmul_params`:
each token meets num_experts_per_tok of the routed experts; shared experts and routers always).

OPT_SIZES (the planning table) is read from conf/model/*.yaml, not kept beside it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping, Optional, Protocol

from omegaconf import DictConfig, OmegaConf

from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.hf_config import attention, family_config
from slurmtrain.common.schema import RootConfig, conf_dir

# Families counted by arithmetic below, with their attention biases (q, k, v); the rest is measured.
LLAMA_LIKE = {"llama": False, "mistral": False, "qwen2": True}


class ModelShape(Protocol):
    """What the planner reads from a model config (slurmtrain.common.schema.ModelConfig has it)."""

    @property
    def name(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def ffn_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_positions(self) -> int: ...


@dataclass(frozen=True)
class Shape:
    """A model architecture as the schema's `model` group holds it (planning tables, tests)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_dim: int
    vocab_size: int = 50272
    max_positions: int = 2048
    word_embed_proj_dim: Optional[int] = None
    layer_norm_before: bool = True
    family: str = "opt"
    num_kv_heads: Optional[int] = None
    tie_embeddings: bool = True
    hf_extra: Mapping[str, object] = field(default_factory=dict, hash=False, compare=False)


OptShape = Shape  # the name the OPT-only planner had


def family(model: ModelShape) -> str:
    return getattr(model, "family", None) or "opt"


def extra(model: ModelShape) -> Mapping[str, object]:
    found = getattr(model, "hf_extra", None)
    return found if isinstance(found, Mapping) and found else {}


def embed_dim(model: ModelShape) -> int:
    return getattr(model, "word_embed_proj_dim", None) or model.hidden_size


def kv_heads(model: ModelShape) -> int:
    return getattr(model, "num_kv_heads", None) or model.num_heads


def head_dim(model: ModelShape) -> int:
    """Per-head width: config.json's head_dim when it sets one, else hidden / heads."""
    given = extra(model).get("head_dim")
    return (
        int(given)
        if isinstance(given, (int, float)) and given
        else model.hidden_size // model.num_heads
    )


def attention_width(model: ModelShape) -> int:
    """Query heads x head width: the size of q and of the attention output (h for OPT)."""
    return model.num_heads * head_dim(model)


def gated_mlp(model: ModelShape) -> bool:
    """SwiGLU-style MLP (gate, up, down: three h x ffn matrices) rather than fc1/fc2."""
    return family(model) in LLAMA_LIKE


def modules(model: ModelShape) -> list[list[int]]:
    """Elements of each module's own parameters, module by module (tied lm_head listed once)."""
    fam = family(model)
    if fam == "opt":
        return _opt_modules(model)
    if fam in LLAMA_LIKE:
        return _llama_modules(model)
    return list(_measured(_spec(model))[0])


def _opt_modules(model: ModelShape) -> list[list[int]]:
    h, f, e = model.hidden_size, model.ffn_dim, embed_dim(model)
    layer = [[h * h, h]] * 4 + [[h * f, f], [f * h, h]] + [[h, h]] * 2  # q k v out, fc1 fc2, 2 LN
    out = [[model.vocab_size * e], [(model.max_positions + 2) * h]] + layer * model.num_layers
    if e != h:
        out += [[e * h], [e * h]]  # project_in / project_out, no bias
    if getattr(model, "layer_norm_before", True):
        out.append([h, h])  # final layer norm (absent in post-LN OPT-350m)
    return out


def _llama_modules(model: ModelShape) -> list[list[int]]:
    h, f, v = model.hidden_size, model.ffn_dim, model.vocab_size
    q, kv = attention_width(model), kv_heads(model) * head_dim(model)
    fam, more = family(model), extra(model)
    qkv_bias = LLAMA_LIKE[fam] if fam == "qwen2" else bool(more.get("attention_bias", False))
    o_bias = fam != "qwen2" and bool(more.get("attention_bias", False))
    mlp_bias = fam == "llama" and bool(more.get("mlp_bias", False))

    def linear(n_in: int, n_out: int, bias: bool) -> list[int]:
        return [n_in * n_out] + ([n_out] if bias else [])

    layer = [
        linear(h, q, qkv_bias),
        linear(h, kv, qkv_bias),
        linear(h, kv, qkv_bias),
        linear(q, h, o_bias),
        linear(h, f, mlp_bias),  # gate
        linear(h, f, mlp_bias),  # up
        linear(f, h, mlp_bias),  # down
        [h],  # input RMSNorm (weight only)
        [h],  # post-attention RMSNorm
    ]
    out = [[v * h]] + layer * model.num_layers + [[h]]  # embedding, layers, final norm
    if not getattr(model, "tie_embeddings", True):
        out.append([v * h])  # untied lm_head
    return out


def param_count(model: ModelShape) -> int:
    """Parameters of transformers' model of this shape (a tied lm_head counted once)."""
    return sum(sum(m) for m in modules(model))


def largest_layer_params(model: ModelShape) -> int:
    """Params of the biggest single module, as DeepSpeed's stage3 `model_to_params` counts them."""
    return max(sum(m) for m in modules(model))


def tensor_sizes(model: ModelShape) -> list[int]:
    """Elements of every parameter tensor (ZeRO-3 keeps the small ones whole)."""
    return [n for m in modules(model) for n in m]


def matmul_params(model: ModelShape) -> int:
    """Weights used in matrix multiplies, once per token (no biases, norms or lookups): the lm_head
    (vocab x embed, tied or not) is one; embeddings and positions are lookups."""
    fam = family(model)
    h, f, v = model.hidden_size, model.ffn_dim, model.vocab_size
    if fam == "opt":
        e = embed_dim(model)
        proj = 2 * e * h if e != h else 0
        return model.num_layers * (4 * h * h + 2 * h * f) + v * e + proj
    if fam in LLAMA_LIKE:
        q, kv = attention_width(model), kv_heads(model) * head_dim(model)
        return model.num_layers * (2 * h * q + 2 * h * kv + 3 * h * f) + v * h
    return _measured(_spec(model))[1]


def experts(model: ModelShape) -> Optional[tuple[int, int]]:
    """(experts each token is routed to, routed experts) of a mixture-of-experts model; None for
    a dense one. Read from transformers' names in config.json (model.hf_extra)."""
    return routing(extra(model))


def routing(more: Mapping[str, object]) -> Optional[tuple[int, int]]:
    """`experts` from config.json's keys."""
    top = more.get("num_experts_per_tok")
    routed = next(
        (more[k] for k in ("n_routed_experts", "num_local_experts", "num_experts") if more.get(k)),
        None,
    )
    if isinstance(top, int) and isinstance(routed, int) and 0 < top < routed:
        return top, routed
    return None


def active_params(model: ModelShape) -> int:
    """Parameters one token meets: all of them, but for a mixture of experts only
    num_experts_per_tok of the routed experts' weights (what FLOPs and MFU count)."""
    if experts(model) is None or family(model) == "opt" or family(model) in LLAMA_LIKE:
        return param_count(model)
    return _measured(_spec(model))[2]


def plan_notes(model: ModelShape, gpus: Optional[int] = None) -> str:
    """What the plan says of the model beyond its size: the attention it trains with, and for a
    mixture of experts the parameters a token meets (FLOPs, MFU) beside all of them (memory)."""
    chosen = attention(
        {
            "family": family(model),
            "attn_implementation": getattr(model, "attn_implementation", None),
        },
        gpus,
    )
    out = f"attention {chosen}"
    routed = experts(model)
    if routed is not None:
        total, active = param_count(model), active_params(model)
        out += (
            f"; MoE: {routed[0]} of {routed[1]} experts per token, {_size(active)} of "
            f"{_size(total)} params active (FLOPs and MFU on active, memory on all)"
        )
    return out


def _size(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


# -- any other family: counted on the meta device ---------------------------------------------------


def _spec(model: ModelShape) -> str:
    """The model's config as canonical JSON (a cache key; what compute/model.py builds from)."""
    keys = ("num_layers", "hidden_size", "num_heads", "ffn_dim", "vocab_size", "max_positions")
    view = {k: getattr(model, k) for k in keys}
    view.update(
        config=getattr(model, "config", None),  # model=hf: built from the file, as compute does
        family=family(model),
        num_kv_heads=getattr(model, "num_kv_heads", None),
        tie_embeddings=getattr(model, "tie_embeddings", True),
        hf_extra=_plain(extra(model)),
    )
    return json.dumps(view, sort_keys=True)


def _plain(value: Mapping[str, object]) -> dict[str, object]:
    """hf_extra as a plain dict: a DictConfig on the login side, a dict elsewhere."""
    data = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    return {str(key): item for key, item in data.items()} if isinstance(data, Mapping) else {}


@functools.lru_cache(maxsize=16)
def _measured(spec: str) -> tuple[tuple[list[int], ...], int, int]:
    """(each module's parameter sizes, matmul weights a token meets, parameters a token meets) of
    the model built on the meta device; a config transformers cannot build is one line."""
    import torch
    from transformers import AutoModelForCausalLM

    view = json.loads(spec)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(family_config(view))
    except ConfigError:
        raise
    except Exception as err:  # any error of the family's code: the user's key, not our bug
        text = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        raise ConfigError(
            f"model.config: transformers cannot build this {view['family']} model ({text}); fix "
            f"the key it names in config.json or with model.hf_extra.KEY=VALUE"
        ) from None
    seen: set[int] = set()
    out = []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if own:
            out.append([p.numel() for p in own])
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    total = sum(sum(m) for m in out)
    routed_by = routing(view["hf_extra"])
    if routed_by is None:
        return tuple(out), matmul, total
    # Routed experts' weights: tensors under an `experts` module with one slice per expert (fused
    # 3-D weights in transformers 5, or Linear layers in a per-expert ModuleList).
    top, routed = routed_by
    fused, linear = 0, 0
    for name, p in model.named_parameters():
        if ".experts." not in f".{name}" or "router" in name:
            continue
        if p.dim() >= 2 and p.shape[0] == routed and not name.endswith(".bias"):
            fused += p.numel()
        elif name.endswith(".weight"):
            linear += p.numel()  # a per-expert Linear: counted by `matmul` above
    expert_weights = fused + linear
    idle = expert_weights - expert_weights * top // routed
    return tuple(out), matmul - linear + (fused + linear) * top // routed, total - idle


def params_of(cfg: RootConfig) -> int:
    """The config's parameter count: the one its checked view carries (common/derived.Derived,
    counted once at the start of `check`), else counted now."""
    known = derived_of(cfg).params
    return known if known is not None else param_count(cfg.model)


# -- the shipped configs ----------------------------------------------------------------------------


def conf_models() -> Path:
    return Path(conf_dir()) / "model"


@functools.lru_cache(maxsize=1)
def shipped() -> dict[str, Shape]:
    """Every conf/model/*.yaml with its own shape (model=hf, which reads a folder, left out)."""
    names = {f.name for f in fields(Shape)}
    out = {}
    for path in sorted(conf_models().glob("*.yaml")):
        data = _load_yaml(path)
        if not isinstance(data, dict) or "num_layers" not in data:
            continue
        shape = Shape(**{str(k): v for k, v in data.items() if k in names})
        out[shape.name] = shape
    return out


def _load_yaml(path: Path) -> object:
    """A model YAML as OmegaConf reads it, through libyaml's C parser (~50x faster: every login
    command plans with these at import); one with an interpolation through OmegaConf itself."""
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

    text = path.read_text()
    loader = getattr(yaml, "CSafeLoader", None)
    if "${" in text or loader is None:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return yaml.load(text, Loader=_float_loader(loader))


@functools.lru_cache(maxsize=1)
def _float_loader(base: type) -> type:
    """`base` reading 1e-5 as a float, as OmegaConf's loader does (YAML 1.1 wants a dot)."""
    import re

    loader = type("FloatLoader", (base,), {})
    loader.add_implicit_resolver(  # type: ignore[attr-defined]
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)"
            r"(?:[eE][-+]?[0-9]+)|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
            r"|\.(?:nan|NaN|NAN))$"
        ),
        list("-+0123456789."),
    )
    return loader


def _opt_sizes() -> dict[str, Shape]:
    # Byte-level vocabularies are the CPU models (opt_tiny, opt_demo), not rows of the paper's table
    sizes = [s for s in shipped().values() if s.family == "opt" and s.vocab_size > 512]
    return {s.name: s for s in sorted(sizes, key=param_count)}


OPT_SIZES: dict[str, Shape] = _opt_sizes()  # the OPT paper's sizes, smallest first
