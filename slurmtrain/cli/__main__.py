"""`python -m slurmtrain.cli COMMAND ...`: status, logs, report, doctor, plan-table, export, sample,
cancel, sync.

Commands that need torch live in compute/ and are reached here by module name only (login/cli code
never imports compute/): each module has `main(argv) -> int`."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "status": "slurmtrain.cli.status",
    "logs": "slurmtrain.cli.logs",
    "report": "slurmtrain.cli.report",
    "doctor": "slurmtrain.cli.doctor",
    "plan-table": "slurmtrain.cli.plan_table",
    "cancel": "slurmtrain.cli.cancel",
    "sync": "slurmtrain.cli.sync",  # offline W&B runs up from a login node
    "export": "slurmtrain.compute.export",
    "sample": "slurmtrain.compute.sample",
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: python -m slurmtrain.cli {{{','.join(COMMANDS)}}} [ARGS]", file=sys.stderr)
        return 2
    return int(importlib.import_module(COMMANDS[sys.argv[1]]).main(sys.argv[2:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
