"""The experiment trackers: one module each, `common/tracker_<name>.py`, declaring a `TRACKER`.

A tracker's module holds its `logger.NAME` schema section, its backend (rank 0's end, which imports
the tracker's package only when opened: the registry loads on the login node without it), its
`slurmtrain sync` step, its import name and its pip extra. The schema (schema_logger.LoggerConfig),
the login node's check (validation_login.check_trackers), rank 0 (compute/observe/trackers.py),
`cli sync` and the README's tracker table all read `trackers()`; adding a tracker is its module,
`conf/logger/NAME.yaml` and its extra in pyproject.toml (the helpers backends share:
common/tracked_rows.py).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

from slurmtrain.common import events
from slurmtrain.common.events import Rows

PREFIX = "tracker_"  # common/tracker_<name>.py; this module is not one


class Context(Protocol):
    """What a backend is opened with (compute/observe/tracker_backends.RunContext)."""

    path: Path  # the run directory
    run_id: str  # one tracker run per slurmtrain run: `<name>-<fingerprint>`
    fingerprint: str
    attempt: int
    rows: Rows

    def config(self) -> dict[str, object]: ...
    def plan(self) -> dict[str, object]: ...
    def provenance(self) -> dict[str, object]: ...
    def started(self) -> Optional[events.Started]: ...


class Backend(Protocol):
    """A tracker's end; `log(step, row, fresh)` and `close(step, kept, fresh)` (ledger rows: the
    new ones, the attempt's) are called by name (trackers.Trackers), so one that failed to open
    needs only its kind. Rows reach a tracker as `event_row` writes them."""

    kind: str


@dataclass(frozen=True)
class SyncArgs:
    dry_run: bool = False
    target: Optional[str] = None  # the tracker's `sync_flag` value (e.g. --mlflow-uri)


@dataclass(frozen=True)
class Tracker:
    name: str  # logger=NAME, the `logger.NAME` section, conf/logger/NAME.yaml
    package: str  # its import name, checked on the login node (comet's is comet_ml)
    extra: str  # pip install 'slurmtrain[EXTRA]'
    section: type  # the `logger.NAME` dataclass; the section being set chooses the tracker
    open: Callable[[Context, Any], Backend]  # (context, section) on rank 0, once per attempt
    sync: Callable[[Path, Optional[Mapping[str, object]], SyncArgs], int]  # (run dir, section)
    offline: str  # where it writes without a network (the README's table)
    sync_says: str  # what `slurmtrain sync` does with it (the README's table)
    sync_flag: Optional[tuple[str, str]] = None  # a `cli sync` option giving SyncArgs.target

    def install_line(self) -> str:
        return f"pip install 'slurmtrain[{self.extra}]'"


@functools.cache
def trackers() -> tuple[Tracker, ...]:
    """Every common/tracker_<name>.py's TRACKER, by name."""
    found = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith(PREFIX) and info.name != __name__.rsplit(".", 1)[1]:
            spec = importlib.import_module(f"slurmtrain.common.{info.name}").TRACKER
            assert isinstance(spec, Tracker) and info.name == PREFIX + spec.name, info.name
            found.append(spec)
    return tuple(sorted(found, key=lambda t: t.name))


def names() -> tuple[str, ...]:
    return tuple(t.name for t in trackers())


def get(name: str) -> Tracker:
    return {t.name: t for t in trackers()}[name]


def readme_table() -> str:
    """The README's tracker table (tests/unit/test_tracker_registry.py checks it is there)."""
    lines = [
        "| `logger=` | imports | install | offline, in the run directory | `slurmtrain sync` |",
        "|---|---|---|---|---|",
    ]
    for t in trackers():
        install = f"`{t.install_line()}`"
        lines.append(f"| `{t.name}` | `{t.package}` | {install} | {t.offline} | {t.sync_says} |")
    return "\n".join(lines)
