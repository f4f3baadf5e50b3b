"""The schema's key tree, built once per process from its dataclasses: what `+key=value` overrides
are checked against (common/validation_login.check_known_keys).

A sweep checks every point; walking a plain nested dict costs microseconds where OmegaConf's
structured nodes cost tens of milliseconds per point.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Optional, Union, get_args, get_origin, get_type_hints

# A section's known keys (a dataclass), a list of such sections, or None: anything goes (a dict
# field such as cluster.env, or a scalar).
Tree = Union[dict[str, "Tree"], tuple["Tree"], None]


@functools.cache
def key_tree(kind: type) -> Tree:
    """The keys of dataclass `kind`, nested."""
    hints = get_type_hints(kind)
    return {f.name: _field_tree(hints[f.name]) for f in dataclasses.fields(kind)}


def _field_tree(tp: object) -> Tree:
    if get_origin(tp) in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return key_tree(tp)
    if get_origin(tp) is list:
        (element,) = get_args(tp) or (None,)
        if isinstance(element, type) and dataclasses.is_dataclass(element):
            return (key_tree(element),)
    return None


def unknown_key(data: object, tree: Tree, path: str = "") -> Optional[str]:
    """The first key of `data` (a plain container) that `tree` does not have, or None."""
    if isinstance(data, dict) and isinstance(tree, dict):
        for key, value in data.items():
            here = f"{path}.{key}" if path else str(key)
            if key not in tree:
                return here
            found = unknown_key(value, tree[key], here)
            if found:
                return found
    elif isinstance(data, list) and isinstance(tree, tuple):
        for i, value in enumerate(data):
            found = unknown_key(value, tree[0], f"{path}[{i}]")
            if found:
                return found
    return None
