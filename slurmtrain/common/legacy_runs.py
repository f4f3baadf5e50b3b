"""Whether a new run directory has siblings an older version may have made (rundir.locate asks).

A config's run made before one of its keys was registered lives under a legacy fingerprint
(common/fingerprint.legacy_fingerprints: ~22 digests to compute and look for). Only a directory
this process did not locate as new can be one: a sweep's points, whose siblings are all its own,
skip the search.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurmtrain.common import fingerprint

# Runs this process located as new, by the keys registered then (tests register keys as they go).
_FOUND_NEW: set[tuple[Path, tuple[str, ...]]] = set()


def older_runs_beside(base: Path) -> bool:
    """`base` (not there yet) is noted as this process's; True when its directory holds an entry
    that is not."""
    keys, parent = tuple(fingerprint.ADDED_RESULT_KEYS), base.parent
    _FOUND_NEW.add((base, keys))
    try:
        return any((parent / name, keys) not in _FOUND_NEW for name in os.listdir(parent))
    except OSError:  # no runs of this name yet
        return False
