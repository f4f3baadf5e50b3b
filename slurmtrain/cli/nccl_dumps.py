"""Which rank and collective a hung job waited on, from the flight recorder's dumps in RUN_DIR/logs.

Each rank's dump (`nccl_trace.<job>.<restart>.<relaunch>.rank_<rank>`, written by our watchdog or
by NCCL on its timeout) lists its last collectives per process group. The collective the others
waited in is the highest sequence number some rank entered and did not finish; ranks whose last
number is lower never joined it: those are the ones to look at (logs/hang.*). No torch: the
pickles are read with an unpickler that refuses every class (they hold only plain data).
"""

from __future__ import annotations

import ast
import io
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NoReturn, Optional, Sequence, TypedDict, cast

NAME = re.compile(r"^nccl_trace\.(?P<attempt>[^/]+?)\.rank_(?P<rank>\d+)$")


class TraceEntry(TypedDict, total=False):
    """One collective in a rank's dump (the keys read here)."""

    collective_seq_id: int
    profiling_name: str
    input_sizes: list[list[int]]
    process_group: Sequence[str]  # (name, description)
    state: str
    retired: bool
    is_p2p: bool


class Dump(TypedDict, total=False):
    entries: list[TraceEntry]
    pg_config: dict[str, dict[str, object]]  # group -> {"desc", "ranks", ...}


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"{module}.{name}: not part of a flight recorder dump")


def read(path: Path) -> Dump:
    """One rank's dump as a dict (`entries`, `pg_config`, ...)."""
    with open(path, "rb") as f:
        data = _DataOnly(io.BytesIO(f.read())).load()
    if not isinstance(data, dict) or "entries" not in data:
        raise ValueError(f"{path}: not a flight recorder dump")
    return cast(Dump, data)  # a dict with entries: checked above


def find(logs: Path) -> dict[str, dict[int, Path]]:
    """{attempt key "<job>.<restart>.<relaunch>": {rank: path}} of the dumps in `logs`."""
    found: dict[str, dict[int, Path]] = {}
    for path in logs.glob("nccl_trace.*"):
        m = NAME.match(path.name)
        if m and path.is_file():
            found.setdefault(m["attempt"], {})[int(m["rank"])] = path
    return found


@dataclass
class Stall:
    """One process group's hang: the collective waited in, who waited, who never came."""

    group: str
    seq: int
    op: str
    sizes: Optional[list[list[int]]]
    waited: list[int]
    behind: dict[int, str] = field(default_factory=dict)  # rank -> its last collective
    no_dump: list[int] = field(default_factory=list)
    disagree: dict[int, str] = field(default_factory=dict)  # rank -> its op at `seq`

    def line(self) -> str:
        what = f"#{self.seq} {self.op} {_sizes(self.sizes)} on {self.group}"
        if self.behind:
            lasts = "; ".join(f"rank {r}: {last}" for r, last in sorted(self.behind.items()))
            text = (
                f"rank{'s' if len(self.behind) > 1 else ''} {ranges(self.behind)} never joined "
                f"collective {what}, which rank{'s' if len(self.waited) > 1 else ''} "
                f"{ranges(self.waited)} waited in (last collective of {lasts})"
            )
        else:
            text = (
                f"every rank with a dump ({ranges(self.waited)}) waited in collective {what}: "
                f"none stayed behind (a network or NCCL stall, or a rank that died inside it)"
            )
        if self.no_dump:
            text += f"; no dump from rank{'s' if len(self.no_dump) > 1 else ''} "
            text += f"{ranges(self.no_dump)} (its process ended first)"
        if self.disagree:
            ops = ", ".join(f"rank {r}: {op}" for r, op in sorted(self.disagree.items()))
            text += f"; ranks disagree on #{self.seq}: {ops}"
        return text


def _sizes(sizes: Optional[list[list[int]]]) -> str:
    try:
        return "x".join(str(n) for n in sizes[0]) if sizes and sizes[0] else "[]"
    except (TypeError, IndexError):
        return str(sizes)


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    run: list[int] = []
    for r in sorted(ranks):
        if run and r != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(r)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _finished(entry: TraceEntry) -> bool:
    return bool(entry.get("retired")) or entry.get("state") == "completed"


def _group(entry: TraceEntry) -> str:
    name, desc = (list(entry.get("process_group") or ("?", "")) + [""])[:2]
    return desc if desc and desc != "undefined" else f"group {name}"


def _members(dumps: dict[int, Dump], group: str) -> Optional[set[int]]:
    """The group's ranks from any dump's pg_config (None: not recorded)."""
    for dump in dumps.values():
        for cfg in (dump.get("pg_config") or {}).values():
            if isinstance(cfg, dict) and (cfg.get("desc") or "") in (group, ""):
                try:
                    return set(ast.literal_eval(str(cfg.get("ranks"))))
                except (ValueError, SyntaxError):
                    return None
    return None


def analyse(dumps: dict[int, Dump], world: Optional[int] = None) -> list[Stall]:
    """The stalled collective of each process group with one (default group first)."""
    lasts: dict[str, dict[int, TraceEntry]] = {}
    for rank, dump in dumps.items():
        for e in dump.get("entries") or []:
            if e.get("is_p2p"):
                continue
            mine = lasts.setdefault(_group(e), {})
            if rank not in mine or e["collective_seq_id"] >= mine[rank]["collective_seq_id"]:
                mine[rank] = e
    stalls: list[Stall] = []
    for group, last in lasts.items():
        top = max(e["collective_seq_id"] for e in last.values())
        at_top = {r: e for r, e in last.items() if e["collective_seq_id"] == top}
        waited = sorted(r for r, e in at_top.items() if not _finished(e))
        if not waited:
            continue
        first = at_top[waited[0]]
        members = _members(dumps, group) or (set(range(world)) if world else set(dumps))
        stalls.append(
            Stall(
                group=group,
                seq=top,
                op=str(first.get("profiling_name")),
                sizes=first.get("input_sizes"),
                waited=waited,
                behind={
                    r: f"#{e['collective_seq_id']} {e.get('profiling_name')}"
                    for r, e in last.items()
                    if e["collective_seq_id"] < top
                },
                no_dump=sorted(set(members) - set(dumps)),
                disagree={
                    r: str(e.get("profiling_name"))
                    for r, e in at_top.items()
                    if (e.get("profiling_name"), e.get("input_sizes"))
                    != (first.get("profiling_name"), first.get("input_sizes"))
                },
            )
        )
    return sorted(stalls, key=lambda s: (s.group != "default_pg", s.group))


def summary(logs: Path, world: Optional[int] = None) -> list[str]:
    """The lines `slurmtrain logs` prints for the newest attempt with dumps ([] when none)."""
    found = find(logs)
    if not found:
        return []
    key = max(found, key=lambda k: max(p.stat().st_mtime for p in found[k].values()))
    dumps: dict[int, Dump] = {}
    bad: list[str] = []
    for rank, path in sorted(found[key].items()):
        try:
            dumps[rank] = read(path)
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as err:
            bad.append(f"{path.name}: unreadable ({type(err).__name__})")
    head = f"collectives (flight recorder, attempt {key}, {len(dumps)} dumps):"
    lines = [f"{head} {s.line()}" for s in analyse(dumps, world)]
    if not lines and dumps:
        lines = [f"{head} no collective was in flight"]
    return lines + [f"collectives: {b}" for b in bad]
