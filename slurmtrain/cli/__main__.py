"""`slurmtrain COMMAND ...` (also `python -m slurmtrain.cli COMMAND ...`): status, logs, report,
doctor, sample, export, cancel, sync, plan-table, prepare-data.

`slurmtrain` (slurmtrain/__main__.py) hands argv here when its first word is a command name, before
Hydra sees it: a command name is never a training override (those hold '=' or start with '+', '~'
or '-'). Commands that need torch live in compute/ and are reached here by module name only
(login/cli code never imports compute/): each module has `main(argv) -> int`."""

from __future__ import annotations

import importlib
import sys
from typing import Optional

COMMANDS = {
    "status": "slurmtrain.cli.status",
    "logs": "slurmtrain.cli.logs",
    "report": "slurmtrain.cli.report",
    "doctor": "slurmtrain.cli.doctor",
    "sample": "slurmtrain.compute.sample",
    "export": "slurmtrain.compute.export",
    "cancel": "slurmtrain.cli.cancel",
    "sync": "slurmtrain.cli.sync",  # offline W&B runs up from a login node
    "plan-table": "slurmtrain.cli.plan_table",
    "prepare-data": "slurmtrain.cli.prepare_data",
}
SUMMARY = {
    "status": "every run, newest first: state, attempt, step, valid_loss, checkpoint, job",
    "logs": "a run's rank logs merged, the first error marked",
    "report": "goodput table and a PNG: loss, tokens/s, MFU over wall time",
    "doctor": "is this machine (--srun: each compute node) ready? python, torch, CUDA, Slurm",
    "sample": "text from a run's checkpoint or an export folder (needs torch)",
    "export": "a run's checkpoint as a Hugging Face folder (needs torch)",
    "cancel": "cancel every job of a run; checkpoints are kept",
    "sync": "upload a run's offline W&B run (logger=wandb), copy its MLflow run",
    "plan-table": "memory per GPU for every OPT size and ZeRO stage",
    "prepare-data": "text/JSONL files -> one token file for data=tokens (or use data=text)",
}
# commands whose first argument is a run, resolved here (cli/run_arg.py) since compute/ reads
# only a directory or a name; an argument that names no run is passed on as it is
RUN_FIRST = ("export", "sample")
# their --help's example (their parsers live in compute/, which this dispatcher only names)
EXAMPLES = {
    "export": "example: slurmtrain export licenses --out exports/licenses   (a name: its newest run)",
    "sample": "example: slurmtrain sample licenses --prompt 'The GNU' --tokens 80 --temperature 0.5",
}


def overview() -> str:
    """`slurmtrain --help`: both forms, every command, and where the config's help is."""
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  slurmtrain {c.ljust(width)}  {SUMMARY[c]}" for c in COMMANDS)
    return f"""usage: slurmtrain [KEY=VALUE ...]         train: compose, plan, submit (Hydra overrides)
       slurmtrain -m KEY=A,B ...           a sweep: one Slurm job array
       slurmtrain COMMAND [ARGS]           look after runs:

{rows}

`slurmtrain COMMAND --help` shows a command's arguments and an example. A RUN argument is a run
directory (runs/NAME/FINGERPRINT), a run name, a name directory (runs/NAME) or a glob of them.
`python -m slurmtrain` and `python -m slurmtrain.cli COMMAND` are the same commands.

Training config: `slurmtrain --cfg job [KEY=VALUE ...]` prints the composed config;
`slurmtrain KEY=VALUE --help` shows the config groups and examples (Hydra's help page);
`slurmtrain --hydra-help` Hydra's own flags. Plan without submitting: add dry_run=true.
"""


def _run_first(name: str, args: list[str]) -> list[str]:
    """export/sample NAME|GLOB|DIR ...: the run it names as a directory (run_arg.one); any other
    first argument (an export folder, an option) as given."""
    if name not in RUN_FIRST or not args or args[0].startswith("-"):
        return args
    from pathlib import Path

    from slurmtrain.cli import run_arg

    if (Path(args[0]).expanduser() / "config.json").is_file():  # sample EXPORT_DIR
        return args
    if not run_arg.resolve(args[0])[0]:
        return args  # the command's own message names what it accepts
    run = run_arg.one(args[0], name)
    return [str(run), *args[1:]]


def dispatch(argv: list[str]) -> int:
    """argv: [COMMAND, ARGS...]; the command's exit code."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(overview(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"slurmtrain: unknown command {name!r}; one of: {', '.join(COMMANDS)} "
            f"(`slurmtrain --help`)",
            file=sys.stderr,
        )
        return 2
    if "-h" in args or "--help" in args:
        return _help(name, args)
    return int(importlib.import_module(COMMANDS[name]).main(_run_first(name, args)) or 0)


def _help(name: str, args: list[str]) -> int:
    """The command's own --help, and an example for those that have none in their parser."""
    try:
        code = importlib.import_module(COMMANDS[name]).main(args)
    except SystemExit as done:  # argparse's --help
        code = done.code
    if name in EXAMPLES:
        print(f"\n{EXAMPLES[name]}")
    return int(code or 0)


def main(argv: Optional[list[str]] = None) -> int:
    return dispatch(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
