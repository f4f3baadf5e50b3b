"""Fields of a metrics.jsonl row (a plain dict, not a ledger row) as numbers, for the bench
scripts: absent, null or non-numeric fields read as the default (number) or None (integer)."""

from __future__ import annotations

from typing import Mapping, Optional

from slurmtrain.common.jsonl import as_integer, as_number


def number(row: Mapping[str, object], key: str, default: float = 0.0) -> float:
    return as_number(row.get(key), default)


def integer(row: Mapping[str, object], key: str) -> Optional[int]:
    return as_integer(row.get(key))
