"""A resolved config as RootConfig's own dataclasses, built from its plain dict, and written back.

The login side reads a sweep point's config hundreds of times (validation, plan, Slurm flags,
batch script); an OmegaConf node costs ~15 us per attribute, a dataclass ~50 ns. The plain dict
(schema.plain: what config.yaml records) is made once per point anyway, so the view is built from
it (~10x cheaper than OmegaConf.to_object). What validation fills in on the view (the batch, the
steps, cluster.time) is written back to the DictConfig, which stays the one that is recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import types
from typing import Any, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig

from slurmtrain.common.schema import RootConfig


def build(data: dict[str, object]) -> RootConfig:
    """RootConfig from schema.plain's dict (Enums from their names). Raises on what does not fit
    (a key the schema lacks, a value OmegaConf left missing): the caller reads the DictConfig then."""
    view = _section(RootConfig, data)
    assert isinstance(view, RootConfig)
    return view


def _section(kind: type, data: object) -> object:
    if not isinstance(data, dict):
        raise TypeError(f"{kind.__name__}: not a section ({data!r:.40})")
    fields = _fields(kind)
    return kind(**{str(k): _value(fields[str(k)], v) for k, v in data.items()})


@functools.cache
def _fields(kind: type) -> dict[str, object]:
    hints = get_type_hints(kind)
    return {f.name: _unwrapped(hints[f.name]) for f in dataclasses.fields(kind) if f.init}


def _unwrapped(tp: object) -> object:
    """Optional[X] as X (None passes through _value untouched)."""
    if get_origin(tp) in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else Any
    return tp


def _value(tp: object, value: object) -> object:
    if value is None:
        return None
    if isinstance(value, str) and value == "???":
        raise ValueError(
            "a missing value"
        )  # OmegaConf's MISSING: validation on the DictConfig says which
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _section(tp, value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp[str(value)]
    if get_origin(tp) is list and isinstance(value, list):
        (element,) = get_args(tp) or (Any,)
        return [_value(element, v) for v in value]
    return value


def validated(cfg: DictConfig, view: RootConfig, check: Any) -> None:
    """Run `check(view)` (validation, which fills in derived values) and write every value it
    changed back into `cfg`, through OmegaConf (which types it as the schema says)."""
    before = copy.deepcopy(view)
    check(view)
    _write_back(cfg, before, view)


def _write_back(node: Any, before: object, after: object) -> None:
    for f in dataclasses.fields(after):  # type: ignore[arg-type]
        old, new = getattr(before, f.name), getattr(after, f.name)
        if dataclasses.is_dataclass(new) and not isinstance(new, type):
            _write_back(getattr(node, f.name), old, new)
        elif old != new or type(old) is not type(new):
            setattr(node, f.name, new)
