"""The sbatch and srun options slurmtrain owns: refused in cluster.sbatch_extra / srun_extra with one
line naming the key that does it properly, or merged where that is the meaning (issue 35).

Why: an extra `--signal` replaced ours and the time-limit save never fired; `--ntasks-per-node`
rendered beside the plan's; `requeue=false` rendered `--requeue=False`; a second `--comment` lost
the run tag `cli cancel` finds jobs by; `--mem-per-cpu` beside our `--mem=0` is fatal to sbatch; a
`--dependency` baked into job.sbatch made every later attempt wait for a job long gone. Merged:
a user `comment` is kept beside the run tag (both readable, space separated), `mem_per_cpu` /
`mem_per_gpu` replace our memory request, `dependency` applies to the first submission only.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, MutableMapping, Optional

from slurmtrain.common.errors import ConfigError

# sbatch's short options, as their long names.
SBATCH_SHORT = {
    "N": "nodes",
    "n": "ntasks",
    "o": "output",
    "e": "error",
    "J": "job-name",
    "d": "dependency",
    "c": "cpus-per-task",
    "p": "partition",
    "A": "account",
    "q": "qos",
    "t": "time",
    "C": "constraint",
    "x": "exclude",
    "a": "array",
    "G": "gpus",
}
# sbatch options slurmtrain sets itself -> what to set instead.
SBATCH_OWNED = {
    "signal": "cluster.signal_lead_s=S (slurmtrain asks USR2 S seconds before the limit; "
    "its handler saves)",
    "nodes": "nodes=N (or a range nodes=2-4)",
    "ntasks": "nodes= and gpus_per_node= (one task per GPU; cluster.cpu_tasks_per_node on CPUs)",
    "ntasks-per-node": "gpus_per_node=N (one task per GPU; cluster.cpu_tasks_per_node on CPUs)",
    "tasks-per-node": "gpus_per_node=N (one task per GPU; cluster.cpu_tasks_per_node on CPUs)",
    "requeue": "faults.* (slurmtrain always asks --requeue and requeues itself)",
    "no-requeue": "faults.* budgets (slurmtrain requeues itself; a budget of 0 stops the run)",
    "open-mode": "nothing: slurmtrain appends every attempt to the run's logs",
    "output": "runs_root=DIR (the logs are RUN_DIR/logs)",
    "error": "runs_root=DIR (the logs are RUN_DIR/logs)",
    "job-name": "name=NAME",
    "array": "a sweep (`-m`): slurmtrain makes the array",
    "no-kill": "faults.spare_nodes=K",
    "time": "cluster.time",
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "constraint": "cluster.constraint",
    "exclude": "cluster.exclude",
    "exclusive": "cluster.exclusive=true",
    "mem": "cluster.mem",
    "cpus-per-task": "cluster.cpus_per_task",
    "gpus-per-node": "gpus_per_node",
    "mincpus": "cluster.cpus_per_task",
}
MERGED = ("comment", "dependency", "mem-per-cpu", "mem-per-gpu")

# srun options on the ranks' line that slurmtrain sets -> what to set instead.
SRUN_SHORT = {"n": "ntasks", "N": "nodes", "w": "nodelist", "o": "output", "e": "error"}
SRUN_SHORT.update({"c": "cpus-per-task", "K": "kill-on-bad-exit", "W": "wait", "u": "unbuffered"})
SRUN_OWNED = {
    "ntasks": "nodes= and gpus_per_node=",
    "nodes": "nodes=N",
    "ntasks-per-node": "gpus_per_node=N",
    "nodelist": "faults.spare_nodes=K (the supervisor names the nodes of each attempt)",
    "output": "runs_root=DIR (ranks log to RUN_DIR/logs/%j_%t.out)",
    "error": "runs_root=DIR (ranks log to RUN_DIR/logs/%j_%t.err)",
    "open-mode": "nothing: slurmtrain appends every attempt to the run's logs",
    "unbuffered": "nothing: slurmtrain passes --unbuffered",
    "cpus-per-task": "cluster.cpus_per_task",
    "cpu-bind": "cluster.cpu_bind=MODE (none: leave binding to the site)",
    "kill-on-bad-exit": "nothing: slurmtrain passes --kill-on-bad-exit=1 (one dead rank ends "
    "the step, so the others do not hang)",
    "wait": "nothing: slurmtrain passes --wait=60",
}


def sbatch_option(given: str) -> str:
    """A sbatch_extra key as sbatch's long option: `mem_per_cpu` -> mem-per-cpu, `J` -> job-name."""
    key = given.lstrip("-")
    return SBATCH_SHORT.get(key, key.replace("_", "-"))


def sbatch_extra(extra: dict[str, object]) -> dict[str, object]:
    """cluster.sbatch_extra as long option -> value, refusing what slurmtrain owns and boolean
    values other than true (a bare flag: sbatch has no way to turn one off in a script)."""
    out: dict[str, object] = {}
    for given, value in extra.items():
        option = sbatch_option(str(given))
        if option in SBATCH_OWNED:
            raise ConfigError(
                f"cluster.sbatch_extra.{given}: slurmtrain sets --{option} itself; "
                f"use {SBATCH_OWNED[option]}"
            )
        if value is False or value is None:
            raise ConfigError(
                f"cluster.sbatch_extra.{given}={value}: a flag cannot be turned off in a batch "
                f"script; drop the key (true renders the bare flag --{option})"
            )
        out[option] = value
    return out


def memory_merged(
    opts: MutableMapping[str, Any], extra: Mapping[str, object], cluster_mem: object
) -> None:
    """A user --mem-per-cpu/--mem-per-gpu replaces our memory request (Slurm takes one of
    --mem, --mem-per-cpu, --mem-per-gpu); an explicit cluster.mem beside it is refused."""
    given = [k for k in ("mem-per-cpu", "mem-per-gpu") if k in extra]
    if not given:
        return
    if len(given) > 1:
        raise ConfigError(
            "cluster.sbatch_extra: mem_per_cpu and mem_per_gpu together; Slurm takes one of them"
        )
    if cluster_mem not in (None, "", "0"):
        raise ConfigError(
            f"cluster.sbatch_extra.{given[0].replace('-', '_')}: beside cluster.mem={cluster_mem} "
            f"(Slurm takes one of --mem, --mem-per-cpu, --mem-per-gpu); drop one"
        )
    opts.pop("mem", None)
    opts.pop("mem-per-gpu", None)


def comment(tag: Optional[str], extra: dict[str, object]) -> Optional[str]:
    """The job's --comment: the run tag, then the user's comment after a space (both readable:
    `cli cancel` finds the tag among the comment's words)."""
    user = extra.get("comment")
    parts = [p for p in (tag, None if user is None else str(user)) if p]
    return " ".join(parts) or None


def srun_extra(args: list[str]) -> None:
    """Refuse, in one line, an srun_extra argument that replaces a flag slurmtrain owns."""
    for arg in args:
        m = re.match(r"--([A-Za-z][A-Za-z-]*)|-([A-Za-z])", arg)
        if not m:
            continue
        option = m[1] or SRUN_SHORT.get(m[2], "")
        if option in SRUN_OWNED:
            raise ConfigError(
                f"cluster.srun_extra={arg!r}: slurmtrain sets --{option} itself; "
                f"use {SRUN_OWNED[option]}"
            )
