"""Slurm hostlists, expanded and compressed without Slurm: `gpu[001-003],a[1-2]b[3-4]` and back.

Behaviour follows Slurm 22.05's `scontrol show hostnames/hostlist` (checked by
tests/cluster/test_hostlist.py against the real binaries). Pure functions; slurm_text.py imports
the two public ones, so callers may name either module.
"""

from __future__ import annotations

import itertools
import re
from typing import Iterable

MAX_RANGE = 65536  # Slurm refuses one bracket range with more hosts ("Too many hosts in range")


def _split_items(text: str) -> list[str]:
    """Split on commas/whitespace outside brackets; empty items are dropped, as Slurm does."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"hostlist {text!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {text!r}: ']' without '['")
        if depth == 0 and (ch == "," or ch.isspace()):
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"hostlist {text!r}: '[' without ']'")
    items.append("".join(cur))
    return [i for i in items if i]


def _parse_ranges(spec: str, item: str) -> list[str]:
    """`1-3,07` -> ['1','2','3','07']; a range's width is its low bound's (`[8-010]` -> 8,9,10)."""
    out: list[str] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(
                f"hostlist {item!r}: bad range {part!r} (use e.g. [1-4,7] or [001-064])"
            )
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi, width = int(lo_s), int(hi_s), len(lo_s)
        if hi < lo:
            raise ValueError(f"hostlist {item!r}: range {part!r} runs backwards")
        if hi - lo + 1 > MAX_RANGE:
            raise ValueError(f"hostlist {item!r}: range {part!r} has more than {MAX_RANGE} hosts")
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


def _expand_item(item: str) -> list[str]:
    parts = re.split(r"\[([^\[\]]*)\]", item)  # text, range, text, range, ..., text
    texts, specs = parts[0::2], parts[1::2]
    if any("[" in t or "]" in t for t in texts):
        raise ValueError(f"hostlist {item!r}: unbalanced brackets")
    if not specs:
        return [item]
    if texts[-1]:  # Slurm 22.05 rejects `n[1-3]-ib`; text may sit only between brackets
        raise ValueError(
            f"hostlist {item!r}: text {texts[-1]!r} after the last ']' "
            f"(Slurm cannot parse it; list those hosts one by one)"
        )
    values = [_parse_ranges(s, item) for s in specs]
    # Slurm's loop order: brackets k-1 .. 1 outermost to innermost, then the last bracket.
    k = len(values)
    order = list(range(k - 2, -1, -1)) + [k - 1]
    hosts = []
    for combo in itertools.product(*(values[i] for i in order)):
        chosen = dict(zip(order, combo))
        hosts.append("".join(t + (chosen[i] if i < k else "") for i, t in enumerate(texts)))
    return hosts


def expand_hostlist(text: str) -> list[str]:
    """`gpu[001-003],a[1-2]b[3-4]` -> every host name, in Slurm's order, duplicates kept."""
    return [h for item in _split_items(text) for h in _expand_item(item)]


def compress_hostlist(hosts: Iterable[str]) -> str:
    """Hosts -> a Slurm hostlist that expands back to the same hosts in the same order.

    Only a trailing number is bracketed (`n1-ib` stays as it is), like `scontrol show hostlist`.
    """
    groups: list[tuple[str, list[tuple[str, int]]]] = []  # (prefix, [(lo, hi)...]) or (host, [])
    for host in hosts:
        if not host or re.search(r"[\s,\[\]]", host):
            raise ValueError(f"host name {host!r} cannot go into a hostlist")
        m = re.fullmatch(r"(.*?)(\d+)", host)
        if not m:
            groups.append((host, []))
            continue
        prefix, num = m.groups()
        if groups and groups[-1][1] and groups[-1][0] == prefix:
            ranges = groups[-1][1]
            lo, hi = ranges[-1]
            if f"{hi + 1:0{len(lo)}d}" == num:
                ranges[-1] = (lo, hi + 1)
            else:
                ranges.append((num, int(num)))
        else:
            groups.append((prefix, [(num, int(num))]))
    out: list[str] = []
    for prefix, spans in groups:
        if not spans:
            out.append(prefix)
        elif len(spans) == 1 and int(spans[0][0]) == spans[0][1]:
            out.append(prefix + spans[0][0])
        else:
            out.append(
                prefix
                + "["
                + ",".join(lo if int(lo) == hi else f"{lo}-{hi:0{len(lo)}d}" for lo, hi in spans)
                + "]"
            )
    return ",".join(out)
