"""`python tools/prepare_data.py ...` is `slurmtrain prepare-data ...` (slurmtrain/cli/prepare_data.py),
kept for scripts that call it by path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without an install

from slurmtrain.cli.prepare_data import CHUNK_BYTES, main, work_units  # noqa: E402

__all__ = ["CHUNK_BYTES", "main", "work_units"]

if __name__ == "__main__":
    raise SystemExit(main())
