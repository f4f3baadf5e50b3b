"""A nested dict copied only along the dotted keys its caller will change; the rest shared."""

from __future__ import annotations

from typing import Iterable


def copied_along(data: dict[str, object], keys: Iterable[str]) -> dict[str, object]:
    """`data` with each dict on a dotted key's path (`a.b.c`: data, data["a"], data["a"]["b"])
    copied, so that popping or setting those keys leaves `data` as it was; every other value is
    shared, read only (a deepcopy of a whole config per sweep point cost more than its digest)."""
    out, copied = dict(data), set()
    for key in keys:
        node = out
        for part in key.split(".")[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                break
            if id(child) not in copied:
                node[part] = child = dict(child)
                copied.add(id(child))
            node = child
    return out
