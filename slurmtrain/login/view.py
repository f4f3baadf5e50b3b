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

from omegaconf import AnyNode, DictConfig, ListConfig, OmegaConf, StringNode, ValueNode

from slurmtrain.common import schema
from slurmtrain.common.schema import RootConfig


def plain(cfg: DictConfig) -> dict[str, object]:
    """schema.plain(cfg) (OmegaConf.to_container: resolved, Enums as their names) read straight
    off OmegaConf's nodes, ~10x faster (a sweep makes one per point); `${a.b}` references to plain
    values are filled in; schema.plain itself for any other interpolation or an unknown node."""
    return plain_and_references(cfg)[0]


def plain_and_references(cfg: DictConfig) -> tuple[dict[str, object], Optional[list[str]]]:
    """plain(cfg), and the text of every interpolation in cfg (None: not known, schema.plain
    made it): what validated() needs to know, without walking the nodes again."""
    refs: list[Ref] = []
    try:
        data = _plain_node(cfg, refs)
        assert isinstance(data, dict)
        for container, key, path, text in refs:
            container[key] = value = _target(data, path)
            if text and not isinstance(value, str):  # a str node converts it: OmegaConf's
                raise _Unplain
    except _Unplain:
        return schema.plain(cfg), None
    return {str(key): value for key, value in data.items()}, [f"${{{r[2]}}}" for r in refs]


Ref = tuple[Any, Any, str, bool]  # (container, key, dotted path, str node): filled in after


class _Unplain(Exception):
    """A value only OmegaConf can give (an interpolation to resolve): schema.plain instead."""


_WHOLE_REF = re.compile(r"\$\{([A-Za-z_]\w*(?:\.\w+)*)\}")


def _plain_node(node: Any, refs: list[Ref]) -> object:
    content = node.__dict__["_content"]
    if content is None or content == "???":
        return content
    if isinstance(content, dict):
        items: Any = content.items()
        out: Any = {}
    elif isinstance(content, list):
        items, out = enumerate(content), [None] * len(content)
    else:  # the section itself interpolated
        raise _Unplain
    for key, child in items:
        if isinstance(child, (DictConfig, ListConfig)):
            out[key] = _plain_node(child, refs)
            continue
        value = child._value()
        if isinstance(value, enum.Enum):
            value = value.name
        elif isinstance(value, str) and "${" in value:
            whole = _WHOLE_REF.fullmatch(value)
            if whole is None or type(child) not in (AnyNode, StringNode):  # others convert
                raise _Unplain
            refs.append((out, key, whole.group(1), type(child) is StringNode))
        elif not isinstance(child, ValueNode):
            raise _Unplain
        out[key] = value
    return out


def _target(data: dict[str, Any], path: str) -> object:
    """A plain value at an absolute dotted key (not itself a reference, nor a container)."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise _Unplain
        node = node[part]
    if isinstance(node, (dict, list)) or (isinstance(node, str) and "${" in node):
        raise _Unplain
    return node


def build(data: dict[str, object]) -> RootConfig:
    """RootConfig from schema.plain's dict (Enums from their names). Raises on what does not fit
    (a key the schema lacks, a value OmegaConf left missing): the caller reads the DictConfig then."""
    view = _section(RootConfig, data)
    assert isinstance(view, RootConfig)
    return view


def _section(kind: type, data: object) -> object:
    if not isinstance(data, dict):
        raise TypeError(f"{kind.__name__}: not a section ({data!r:.40})")
    plain_fields = _plain_fields(kind)
    fields = _fields(kind)
    out = {}
    for k, v in data.items():  # _value's rules; a plain field's value is taken as it is
        key = str(k)
        if key in plain_fields and not (isinstance(v, str) and v == "???"):
            out[key] = v
        else:
            out[key] = _value(fields[key], v)
    return kind(**out)


@functools.cache
def _plain_fields(kind: type) -> frozenset[str]:
    """The fields _value returns as given (no section, Enum or list to make): most of them."""
    return frozenset(
        name
        for name, tp in _fields(kind).items()
        if not (
            isinstance(tp, type) and (dataclasses.is_dataclass(tp) or issubclass(tp, enum.Enum))
        )
        and get_origin(tp) is not list
    )


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
    cfg: DictConfig,
    view: RootConfig,
    check: Any,
    raw: Optional[dict[str, object]] = None,
    texts: Optional[list[str]] = None,
) -> Optional[dict[str, object]]:
    """Run `check(view)` (validation, which fills in derived values) and write every value it
    changed back into `cfg`, through OmegaConf (which types it as the schema says). `raw`:
    schema.plain(cfg) before; returned as schema.plain(cfg) would now give it, or None when an
    interpolation in `cfg` may read a value written (the caller makes it again then). `texts`:
    cfg's interpolations (plain_and_references), else found here."""
    before = _snapshot(view)  # ~5x cheaper than a deepcopy: only containers are copied
    check(view)
    sections: dict[tuple[str, ...], Any] = {(): cfg}  # each DictConfig section reached once
    now: dict[tuple[str, ...], object] = {}
    for path, new in _changes(before, view, ()):
        now[path] = _written(_section_node(sections, path[:-1]), path[-1], new)
    return None if raw is None else _patched(cfg, raw, now, texts)


_NAMES: dict[Any, tuple[str, ...]] = {}  # each section class's field names


def _names(section: Any) -> tuple[str, ...]:
    kind = type(section)
    if kind not in _NAMES:
        _NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return _NAMES[kind]


def _snapshot(section: object) -> dict[str, object]:
    """A section's values as they are now: sections as dicts, containers copied."""
    out: dict[str, object] = {}
    for name in _names(section):
        value = getattr(section, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[name] = _snapshot(value)
        else:
            out[name] = copy.deepcopy(value) if isinstance(value, (list, dict, set)) else value
    return out


def _changes(before: dict[str, object], after: object, path: tuple[str, ...]) -> Iterator[Changed]:
    for name in _names(after):
        old, new = before[name], getattr(after, name)
        if dataclasses.is_dataclass(new) and not isinstance(new, type) and isinstance(old, dict):
            yield from _changes(old, new, (*path, name))
        elif old != new or type(old) is not type(new):
            yield (*path, name), new


def _written(node: Any, key: str, value: object) -> object:
    """setattr(node, key, value), and the value as OmegaConf typed it. A plain value for a typed
    key that exists is handed to its node's _set_value (which converts and checks it), as
    OmegaConf's setattr ends up doing after ~0.3 ms of checks that cannot fail here."""
    child = node.__dict__["_content"].get(key) if isinstance(node, DictConfig) else None
    if (
        isinstance(child, ValueNode)
        and child._has_ref_type()
        and not node._get_flag("readonly")
        and (value is None or isinstance(value, (bool, int, float, enum.Enum)))
    ):
        child._set_value(value)
        return child._value()
    setattr(node, key, value)
    return getattr(node, key)


def _section_node(sections: dict[tuple[str, ...], Any], path: tuple[str, ...]) -> Any:
    if path not in sections:
        sections[path] = getattr(_section_node(sections, path[:-1]), path[-1])
    return sections[path]


def _patched(
    cfg: DictConfig,
    raw: dict[str, object],
    now: dict[tuple[str, ...], object],
    texts: Optional[list[str]] = None,
) -> Optional[dict[str, object]]:
    """`raw` with each written key's value as OmegaConf now holds it, in schema.plain's form
    (OmegaConf.to_container: Enums as their names, containers plain); only the dicts on those
    keys' paths are copied."""
    written = [".".join(path) for path in now]
    try:
        found = texts if texts is not None else _interpolations(cfg)
        if any(_may_read(text, written) for text in found):
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
