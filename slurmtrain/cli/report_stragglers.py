"""`report`'s per-node straggler panel (text): each node the run's `straggler` rows named, with how
many windows, its worst score and rank, and whether it went chronic or was excluded (issue 39)."""

from __future__ import annotations

from slurmtrain.common.events import Rows, Straggler


def node_panel(ledger: Rows) -> list[str]:
    """`  n2  12 windows  worst 1.52x (rank 3)  chronic, excluded` per node, slowest first; empty
    when no straggler was seen."""
    seen: dict[str, list[Straggler]] = {}
    for e in ledger:
        if isinstance(e, Straggler) and e.node:
            seen.setdefault(e.node, []).append(e)
    order = sorted(seen, key=lambda n: -max(r.factor or 0 for r in seen[n]))
    lines = ["stragglers by node (windows above faults.straggler_threshold):"] if seen else []
    for node in order:
        rows = seen[node]
        worst = max(rows, key=lambda r: r.factor or 0)
        marks = [
            w
            for w, on in (
                ("chronic", any(r.chronic for r in rows)),
                ("excluded", any(r.excluded for r in rows)),
            )
            if on
        ]
        lines.append(
            f"  {node}  {len(rows)} windows  worst {worst.factor or 0:.2f}x (rank {worst.rank})"
            + (f"  {', '.join(marks)}" if marks else "")
        )
    return lines
