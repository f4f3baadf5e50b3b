"""Fields of a metrics.jsonl row (a plain dict, not a ledger row) as numbers, for the bench
scripts: absent, null or non-numeric fields read as the default (number) or None (integer)."""

from __future__ import annotations

from typing import Mapping, Optional


def number(row: Mapping[str, object], key: str, default: float = 0.0) -> float:
    value = row.get(key)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            return default
    return default


def integer(row: Mapping[str, object], key: str) -> Optional[int]:
    value = row.get(key)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return int(value)
        except (ValueError, OverflowError):
            return None
    return None
