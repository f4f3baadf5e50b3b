"""Printing the results: a rich table (plain lines when rich is missing or asked), or one JSON line."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Optional, Sequence

from .results import CheckResult, DoctorDoc
from .runner import NodeReport, comparable, this_node

if TYPE_CHECKING:
    from rich.console import Console

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def any_failed(checks: Sequence[CheckResult], nodes: Sequence[NodeReport] = ()) -> bool:
    return any(c.status == "fail" for c in checks) or any(
        c.status == "fail" for n in nodes for c in n.checks
    )


def to_json(checks: Sequence[CheckResult], nodes: Optional[Sequence[NodeReport]] = None) -> str:
    """One line (srun output from several nodes is parsed per task); key 'doctor' first marks the start."""
    node, host = this_node()
    doc: DoctorDoc = {
        "doctor": 1,
        "node": node,
        "host": host,
        "ok": not any_failed(checks, nodes or ()),
        "checks": [c.to_dict() for c in checks],
    }
    if nodes is not None:
        doc["nodes"] = [
            {"node": n.node, "host": n.host, "checks": [c.to_dict() for c in n.checks]}
            for n in nodes
        ]
    return json.dumps(doc)


def _plain(checks: Sequence[CheckResult], title: str) -> None:
    print(title)
    width = max((len(c.name) for c in checks), default=8)
    for c in checks:
        print(f"  [{c.status.upper():4}] {c.name:<{width}}  {c.value}")
        if c.advice:
            print(f"  {'':6} {'':<{width}}  -> {c.advice}")


def _console() -> Console:
    from rich.console import Console  # start-up speed: rich only when rendering

    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def render(checks: Sequence[CheckResult], title: str, plain: bool = False) -> None:
    try:
        from rich.table import Table
    except ImportError:
        plain = True
    if plain:
        _plain(checks, title)
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for col, kw in (
        ("check", {"no_wrap": True}),
        ("status", {"no_wrap": True}),
        ("value", {"ratio": 3}),
        ("advice", {"ratio": 2}),
    ):
        table.add_column(col, **kw)
    for c in checks:
        table.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", c.value, c.advice)
    _console().print(table)


def render_nodes(
    nodes: Sequence[NodeReport], extra: Sequence[CheckResult], plain: bool = False
) -> None:
    """Compute nodes side by side: one status column per node and the value when all nodes agree;
    then every non-ok or differing row per node, with its advice."""
    names = list(dict.fromkeys(c.name for n in nodes for c in n.checks))
    by_node = [{c.name: c for c in n.checks} for n in nodes]
    values = {
        name: {comparable(row[name].value) for row in by_node if name in row} for name in names
    }
    first = {name: next(row[name].value for row in by_node if name in row) for name in names}
    if nodes and not plain:
        try:
            from rich.table import Table
        except ImportError:
            plain = True
        else:
            table = Table(title="compute nodes (srun)", title_justify="left")
            table.add_column("check", no_wrap=True)
            for n in nodes:
                table.add_column(n.node, no_wrap=True)
            table.add_column("value (same on every node unless marked)")
            for name in names:
                cells = [
                    f"[{STYLE[row[name].status]}]{row[name].status}[/]" if name in row else "-"
                    for row in by_node
                ]
                same = len(values[name]) == 1
                table.add_row(
                    name, *cells, first[name] if same else "[yellow]differs, see below[/]"
                )
            _console().print(table)
    if plain:
        for n in nodes:
            _plain(n.checks, f"node {n.node} ({n.host})")
        problems = []
    else:
        problems = [
            (n.node, c)
            for n, row in zip(nodes, by_node)
            for c in row.values()
            if c.status != "ok" or len(values[c.name]) > 1
        ]
    problems += [("srun", c) for c in extra if c.status != "ok"] + [
        ("all", c) for c in extra if c.status == "ok"
    ]
    for where, c in problems:
        print(
            f"  {where} {c.name} [{c.status}]: {c.value}"
            + (f"\n      -> {c.advice}" if c.advice else "")
        )
