"""Which runs `cli status` shows, in what order, and the one line it prints per sweep.

A STATUS argument is a run directory, a name directory (`runs/NAME`: its runs), a runs root (its
names' runs), a bare name found under the runs root (`lr_sweep`), or a glob of any of these
(`runs/lr_*`, `'sweep*'`: a glob without a `/` that matches nothing here is tried under the runs
root). A sweep is the runs under one name directory, when there are more than one. Pure file
reads: no Slurm, no YAML parser (overrides.yaml is a list of plain strings)."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, MutableMapping, Optional, Sequence

from slurmtrain.common import read_skips

if TYPE_CHECKING:
    from slurmtrain.common.events import Row

CONFIG = "config.yaml"
GLOB_CHARS = frozenset("*?[")
# `--state failed`: a run that stopped with a failure class (also one whose smoke run failed)
FAILED_WORDS = ("stopped", "blocked")
# the words a status row's state starts with (RunDir.state's, and status's own), and `failed`
STATE_WORDS = ("running", "stopped", "finished", "new", "unknown", "waiting", "blocked", "failed")


def _is_run(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG))


def _subdirs(path: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:  # another user's 0700 name directory: counted, told in one line
        read_skips.skip(path, 0, f"{type(err).__name__}: {err.strerror or err}")
        return []


def runs_in(path: str) -> list[str]:
    """The run directories `path` names: itself, its children (a name directory), or its
    grandchildren (a runs root); [] when it holds none."""
    if _is_run(path):
        return [path]
    children = _subdirs(path)
    runs = [c for c in children if _is_run(c)]
    if runs:
        return runs
    return [g for c in children for g in _subdirs(c) if _is_run(g)]


def select(args: Sequence[str], root: Path) -> tuple[list[Path], list[str]]:
    """(the run directories the STATUS arguments name, resolved and each once; the arguments
    that name none). No argument: every run under `root`."""
    found: dict[str, None] = {}
    missing = []
    for arg in args or [str(root)]:
        runs = _named(os.path.expanduser(arg), root)
        if not runs:
            missing.append(arg)
        found.update(dict.fromkeys(os.path.realpath(r) for r in runs))
    return [Path(p) for p in found], missing


def _named(arg: str, root: Path) -> list[str]:
    """The runs `arg` names from here; a bare name or glob (no `/`) that names none here is
    tried under the runs root."""
    runs = [r for p in _expand(arg) for r in runs_in(p)]
    if runs or os.path.isabs(arg) or os.sep in arg:
        return runs
    return [r for p in _expand(os.path.join(str(root), arg)) for r in runs_in(p)]


def _expand(pattern: str) -> list[str]:
    return sorted(glob.glob(pattern)) if GLOB_CHARS & set(pattern) else [pattern]


def state_word(state: str) -> str:
    """ "stopped: diverged" -> "stopped"; "unknown: squeue ..." -> "unknown"."""
    return state.split(":", 1)[0].strip()


def wanted(states: Iterable[str]) -> set[str]:
    """`--state a,b --state c` -> {a, b, c}."""
    return {w.strip() for s in states for w in s.split(",") if w.strip()}


def matches(row: Mapping[str, object], words: set[str]) -> bool:
    """Whether a status row's state word is one of `words` (`failed`: stopped with a class)."""
    word = state_word(str(row.get("state") or ""))
    return word in words or ("failed" in words and word in FAILED_WORDS and bool(row.get("class")))


def updated(run: Path, rows: Sequence[Row]) -> float:
    """When the run last changed: its newest ledger row's time, else its directory's mtime."""
    if rows:
        return max(r.time for r in rows)
    try:
        return os.stat(run).st_mtime
    except OSError:
        return 0.0


def overrides(run: Path) -> list[str]:
    """The run's command-line overrides (overrides.yaml, a YAML list of strings) less the ones
    every point of a sweep shares by construction (name=, runs_root=)."""
    try:
        text = (run / "overrides.yaml").read_text()
    except OSError:
        return []
    items = []
    for line in text.splitlines():
        if not line.startswith("- "):
            continue
        item = line[2:].strip()
        if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
            item = item[1:-1].replace("''", "'") if item[0] == "'" else item[1:-1]
        if override_key(item) not in SHARED:
            items.append(item)
    return items


SHARED = ("name", "runs_root")  # overrides every point of a sweep shares by construction


def override_key(item: str) -> str:
    """`+optim.lr=1e-3` -> `optim.lr`."""
    return item.split("=", 1)[0].lstrip("+~")


def varied(points: Sequence[Sequence[str]]) -> list[list[str]]:
    """Each point's overrides (KEY=VALUE as given) whose key is not given alike to every point:
    what tells a sweep's points apart (`optim.lr=0.003`), in the order given."""
    given = [{override_key(i): i for i in p} for p in points]
    keys = {k for g in given for k in g}
    differ = {k for k in keys if len({g.get(k) for g in given}) > 1}
    return [[i for i in p if override_key(i) in differ] for p in points]


def add_swept(rows: Sequence[MutableMapping[str, object]]) -> None:
    """rows[i]["swept"]: the overrides that tell a sweep's point from the other runs under its
    name directory (overrides.yaml: read for the runs of sweeps only); [] for a lone run."""
    by_sweep: dict[str, list[MutableMapping[str, object]]] = {}
    for r in rows:
        by_sweep.setdefault(str(Path(str(r["run"])).parent), []).append(r)
    for points in by_sweep.values():
        if len(points) == 1:
            points[0]["swept"] = []
            continue
        for r, items in zip(points, varied([overrides(Path(str(r["run"]))) for r in points])):
            r["swept"] = items


def sweep_lines(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """One line per sweep (the runs of one name directory, more than one), in the order of the
    rows (newest first): points by state word (stopped ones by class), the best valid_loss, its
    overrides and run directory."""
    by_sweep: dict[str, list[Mapping[str, object]]] = {}
    for r in rows:
        by_sweep.setdefault(str(Path(str(r["run"])).parent), []).append(r)
    lines = []
    for name_dir, points in by_sweep.items():
        if len(points) > 1:
            lines.append(_sweep_line(Path(name_dir).name, points))
    return lines


def _sweep_line(name: str, points: Sequence[Mapping[str, object]]) -> str:
    counts: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    for p in points:
        word = state_word(str(p.get("state") or "?"))
        counts[word] = counts.get(word, 0) + 1
        if p.get("class") and word != "running":
            per = classes.setdefault(word, {})
            per[str(p["class"])] = per.get(str(p["class"]), 0) + 1
    parts = []
    for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        why = ", ".join(f"{c} {k}" for c, k in sorted(classes.get(word, {}).items()))
        parts.append(f"{n} {word}" + (f" ({why})" if why else ""))
    line = f"sweep {name}: {len(points)} points: {', '.join(parts)}"
    best = _best(points)
    if best is None:
        return line + "; no valid_loss yet"
    run = Path(str(best["run"]))
    given = " ".join(overrides(run)) or "no overrides"
    return line + f"; best valid_loss {float(str(best['valid_loss'])):.4f}: {given} ({run.name})"


def _best(points: Sequence[Mapping[str, object]]) -> Optional[Mapping[str, object]]:
    scored = [p for p in points if isinstance(p.get("valid_loss"), (int, float))]
    finite = [p for p in scored if float(str(p["valid_loss"])) == float(str(p["valid_loss"]))]
    return min(finite, key=lambda p: float(str(p["valid_loss"])), default=None)
