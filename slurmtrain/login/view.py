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
import re
import types
from typing import Any, Iterator, Optional, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf

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


Changed = tuple[tuple[str, ...], object]  # a key's path and the value validation gave it


def validated(
    cfg: DictConfig, view: RootConfig, check: Any, raw: Optional[dict[str, object]] = None
) -> Optional[dict[str, object]]:
    """Run `check(view)` (validation, which fills in derived values) and write every value it
    changed back into `cfg`, through OmegaConf (which types it as the schema says). `raw`:
    schema.plain(cfg) before; returned as schema.plain(cfg) would now give it, or None when an
    interpolation in `cfg` may read a value written (the caller makes it again then)."""
    before = copy.deepcopy(view)
    check(view)
    sections: dict[tuple[str, ...], Any] = {(): cfg}  # each DictConfig section reached once
    now: dict[tuple[str, ...], object] = {}
    for path, new in _changes(before, view, ()):
        node = _section_node(sections, path[:-1])
        setattr(node, path[-1], new)
        now[path] = getattr(node, path[-1])  # as OmegaConf typed it
    return None if raw is None else _patched(cfg, raw, now)


def _changes(before: object, after: object, path: tuple[str, ...]) -> Iterator[Changed]:
    for f in dataclasses.fields(after):  # type: ignore[arg-type]
        old, new = getattr(before, f.name), getattr(after, f.name)
        if dataclasses.is_dataclass(new) and not isinstance(new, type):
            yield from _changes(old, new, (*path, f.name))
        elif old != new or type(old) is not type(new):
            yield (*path, f.name), new


def _section_node(sections: dict[tuple[str, ...], Any], path: tuple[str, ...]) -> Any:
    if path not in sections:
        sections[path] = getattr(_section_node(sections, path[:-1]), path[-1])
    return sections[path]


def _patched(
    cfg: DictConfig, raw: dict[str, object], now: dict[tuple[str, ...], object]
) -> Optional[dict[str, object]]:
    """`raw` with each written key's value as OmegaConf now holds it, in schema.plain's form
    (OmegaConf.to_container: Enums as their names, containers plain); only the dicts on those
    keys' paths are copied."""
    written = [".".join(path) for path in now]
    try:
        if any(_may_read(text, written) for text in _interpolations(cfg)):
            return None
    except Exception:  # noqa: BLE001  OmegaConf's internals moved: make it again instead
        return None
    out = dict(raw)
    for (*parents, leaf), value in now.items():
        target = out
        for part in parents:
            section = target[part]
            assert isinstance(section, dict)
            target[part] = target = dict(section)
        target[leaf] = _plain(value)
    return out


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.name
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return value


def _interpolations(node: Any) -> Iterator[str]:
    """Every interpolation's text in a DictConfig/ListConfig (OmegaConf's node tree, walked)."""
    content = node.__dict__["_content"]
    if content is None or isinstance(content, str):  # None, missing, or itself interpolated
        if isinstance(content, str) and "${" in content:
            yield content
        return
    for child in content.values() if isinstance(content, dict) else content:
        if isinstance(child, (DictConfig, ListConfig)):
            yield from _interpolations(child)
        else:
            value = child._value()
            if isinstance(value, str) and "${" in value:
                yield value


# ${a.b.c}: an absolute key; ${oc.env:NAME}: the environment. Anything else (a resolver, a
# relative or nested reference) may read anything.
_REFERENCE = re.compile(r"\$\{([^${}]*)\}")


def _may_read(text: str, written: list[str]) -> bool:
    refs = _REFERENCE.findall(text)
    if text.count("${") != len(refs):
        return True
    for ref in refs:
        if ref.startswith("oc.env:"):
            continue
        if not re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)*", ref):
            return True
        if any(w == ref or w.startswith(ref + ".") or ref.startswith(w + ".") for w in written):
            return True
    return False
