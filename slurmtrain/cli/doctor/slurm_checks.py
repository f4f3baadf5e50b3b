"""Slurm client tools, controller, accounting, partition preemption settings and container runtimes.

Everything runs the real commands with argument lists and short timeouts; the parsing and the
verdicts are pure functions so they can be tested on captured text.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, TypedDict

from slurmtrain.common.commands import Cmd, run_cmd

from .results import CheckResult

TOOLS = ("sbatch", "srun", "scontrol", "sacct", "sinfo")
REQUIRED = ("sbatch", "srun", "scontrol")


def slurm_advice(cmd: Cmd) -> str:
    """What to do about a failed Slurm client command, from its last error line."""
    why = cmd.reason().lower()
    if cmd.rc == 127:
        return (
            "Slurm client tools not on PATH: module load slurm, or run on the cluster's login node"
        )
    if "configuration source" in why or "slurm.conf" in why:
        return "no Slurm configuration: set SLURM_CONF=/path/to/slurm.conf (or ask admins for configless DNS)"
    if "munge" in why or "authentication" in why:
        return "munge authentication failed: munged must run here with the cluster's key"
    if cmd.rc == 124 or "unable to contact" in why or "connect" in why:
        return "slurmctld is down or unreachable: check `scontrol ping` and the SlurmctldHost/port"
    return "run the command by hand to see the full error"


def why(cmd: Cmd) -> str:
    """'tool: reason', without doubling the tool name Slurm already prints."""
    tool, reason = cmd.argv[0], cmd.reason()
    return reason if reason.startswith(tool) else f"{tool}: {reason}"


def _version(tool: str, timeout: float) -> tuple[str, Cmd]:
    return tool, run_cmd([tool, "--version"], timeout)


def check_slurm_tools(timeout: float) -> CheckResult:
    found = [t for t in TOOLS if shutil.which(t)]
    missing = [t for t in TOOLS if t not in found]
    if not found:
        return CheckResult(
            "slurm_tools",
            "fail",
            "none of " + ", ".join(TOOLS) + " on PATH",
            "module load slurm, or run the doctor on the cluster's login node",
        )
    with ThreadPoolExecutor(len(found)) as pool:
        results = dict(pool.map(lambda t: _version(t, timeout), found))
    broken = {t: c for t, c in results.items() if not c.ok}
    versions = {c.out.strip() for c in results.values() if c.ok and c.out.strip()}
    value = (", ".join(sorted(versions)) or "version unknown") + f"; found {' '.join(found)}"
    if missing:
        value += f"; missing {' '.join(missing)}"
    if broken:
        tool, cmd = next(iter(broken.items()))
        return CheckResult(
            "slurm_tools",
            "fail",
            f"{' '.join(broken)} fail: {why(cmd)}"
            + (f"; missing {' '.join(missing)}" if missing else ""),
            slurm_advice(cmd),
        )
    if any(t in missing for t in REQUIRED):
        return CheckResult(
            "slurm_tools",
            "fail",
            value,
            "sbatch, srun and scontrol are needed to submit, "
            "launch and requeue: install the Slurm client or module load slurm",
        )
    if missing:
        return CheckResult("slurm_tools", "warn", value, "status/history need sinfo and sacct")
    if len(versions) > 1:
        return CheckResult(
            "slurm_tools", "warn", value, "mixed Slurm client versions on PATH: load one module"
        )
    return CheckResult("slurm_tools", "ok", value)


class PartitionTally(TypedDict):
    avail: str
    nodes: int
    states: dict[str, int]  # node state -> nodes


def summarize_sinfo(text: str) -> tuple[str, int]:
    """'debug*|up|infinite|4|idle' lines -> ('debug*: up, 4 nodes (4 idle)', nodes down/drained)."""
    parts: dict[str, PartitionTally] = {}
    bad = 0
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 5:
            continue
        name, avail, _limit, count, state = fields[:5]
        entry = parts.setdefault(name, {"avail": avail, "nodes": 0, "states": {}})
        n = int(count) if count.isdigit() else 0
        entry["nodes"] += n
        entry["states"][state] = entry["states"].get(state, 0) + n
        if re.match(r"(down|drain|drng|fail|inval|unk)", state):
            bad += n
    summary = "; ".join(
        f"{name}: {e['avail']}, {e['nodes']} nodes ("
        + ", ".join(f"{n} {s}" for s, n in sorted(e["states"].items()))
        + ")"
        for name, e in parts.items()
    )
    return summary or "no partitions", bad


def check_slurm_controller(timeout: float) -> CheckResult:
    cmd = run_cmd(["sinfo", "-h", "-o", "%P|%a|%l|%D|%T"], timeout)
    if not cmd.ok:
        return CheckResult("slurm_controller", "fail", why(cmd), slurm_advice(cmd))
    summary, bad = summarize_sinfo(cmd.out)
    if bad:
        return CheckResult(
            "slurm_controller",
            "warn",
            summary,
            f"{bad} node(s) down/drained: `sinfo -R` shows why; jobs needing them will wait",
        )
    return CheckResult("slurm_controller", "ok", summary)


def accounting_verdict(cmd: Cmd) -> CheckResult:
    """sacct's answer -> result; a general Slurm failure gets that advice, not the accounting one (pure)."""
    if cmd.ok:
        return CheckResult("slurm_accounting", "ok", "sacct answers (job history available)")
    reason = cmd.reason().lower()
    if not any(word in reason for word in ("accounting", "slurmdbd", "database")):
        return CheckResult("slurm_accounting", "warn", why(cmd), slurm_advice(cmd))
    return CheckResult(
        "slurm_accounting",
        "warn",
        why(cmd),
        "no job accounting: status falls back to squeue/scontrol and the run ledger; finished "
        "jobs vanish after MinJobAge (admins: AccountingStorageType=accounting_storage/slurmdbd)",
    )


def check_slurm_accounting(timeout: float) -> CheckResult:
    return accounting_verdict(
        run_cmd(["sacct", "-n", "-X", "-P", "-S", "now", "-E", "now", "-o", "JobID"], timeout)
    )


def parse_scontrol_config(text: str) -> dict[str, str]:
    """`scontrol show config` 'Key = Value' lines -> {Key: Value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_partitions(text: str) -> list[dict[str, str]]:
    """`scontrol -o show partition` one-line records 'K=V K=V' -> dicts (values may contain '=')."""
    parts = []
    for line in text.splitlines():
        rec = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" in rec:
            parts.append(rec)
    return parts


def slurm_seconds(text: Optional[str]) -> Optional[int]:
    """A duration as scontrol prints it -> seconds; None for UNLIMITED or unparsable.

    '1-02:00:00', '02:00:00', '30:00' (min:sec), '2-12' (days-hours), and bare numbers or '30 sec' as
    seconds (scontrol prints GraceTime and KillWait that way; sbatch's bare-minutes input never appears).
    """
    raw = (text or "").strip().lower()
    if m := re.fullmatch(r"(\d+)\s*(?:sec|s)?", raw):
        return int(m.group(1))
    if m := re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+):(\d+)", raw):
        d, h, mi, s = (int(x or 0) for x in m.groups())
        return ((d * 24 + h) * 60 + mi) * 60 + s
    if m := re.fullmatch(r"(\d+):(\d+)", raw):
        return int(m.group(1)) * 60 + int(m.group(2))
    if m := re.fullmatch(r"(\d+)-(\d+)(?::(\d+))?", raw):
        d, h, mi = (int(x or 0) for x in m.groups())
        return ((d * 24 + h) * 60 + mi) * 60
    return None


def evaluate_partition(config: dict[str, str], part: dict[str, str]) -> CheckResult:
    """Does a preempted job on this partition get a signal, and how long to save? (pure)"""
    name = part.get("PartitionName", "?")
    max_time = part.get("MaxTime", "UNLIMITED")
    grace = slurm_seconds(part.get("GraceTime", "0")) or 0
    kill_wait = slurm_seconds(config.get("KillWait", "30 sec")) or 30
    ptype = config.get("PreemptType", "preempt/none")
    mode = (part.get("PreemptMode") or config.get("PreemptMode") or "OFF").upper()
    user_signal = "send_user_signal" in config.get(
        "PreemptParameters", ""
    ) or "preempt_send_user_signal" in config.get("SlurmctldParameters", "")
    preempting = ptype.lower() not in ("preempt/none", "none", "") and not mode.startswith("OFF")
    value = (
        f"{name}: MaxTime={max_time} PreemptType={ptype} PreemptMode={mode} GraceTime={grace}s "
        f"send_user_signal={'yes' if user_signal else 'no'}"
    )
    lead = (
        "--signal=USR2@<lead>: make the lead exceed the measured checkpoint save time "
        "(Slurm may signal up to 60 s early)"
    )
    state = part.get("State", "UP").upper()
    if state != "UP":
        return CheckResult(
            "partition",
            "warn",
            value + f" State={state}",
            f"partition {name} is {state}: jobs queue but do not start",
        )
    if not preempting:
        return CheckResult(
            "partition", "ok", value, f"no preemption here, only the time limit: {lead}"
        )
    if "SUSPEND" in mode:
        return CheckResult(
            "partition",
            "warn",
            value,
            "preempted jobs are suspended without a signal; "
            "collectives time out if ranks stop unevenly: prefer a REQUEUE partition",
        )
    at_preempt = "your --signal (USR2)" if user_signal else "SIGTERM"
    if grace <= 0:
        return CheckResult(
            "partition",
            "warn",
            value,
            f"GraceTime=0: preempted jobs get SIGTERM and SIGKILL "
            f"KillWait={kill_wait}s later; a longer save is lost: ask admins for GraceTime",
        )
    requeue = "Slurm requeues it" if "REQUEUE" in mode else "CANCEL mode: the job is not requeued"
    return CheckResult(
        "partition",
        "ok" if "REQUEUE" in mode else "warn",
        value,
        f"at preemption tasks get {at_preempt} and {grace}s to save ({requeue}); {lead}",
    )


def check_partition(partition: Optional[str], timeout: float) -> CheckResult:
    with ThreadPoolExecutor(2) as pool:
        conf_f = pool.submit(run_cmd, ["scontrol", "show", "config"], timeout)
        part_f = pool.submit(run_cmd, ["scontrol", "-o", "show", "partition"], timeout)
        conf, parts_cmd = conf_f.result(), part_f.result()
    for cmd in (conf, parts_cmd):
        if not cmd.ok:
            return CheckResult(
                "partition", "fail", f"{partition or 'default'}: {why(cmd)}", slurm_advice(cmd)
            )
    parts = parse_partitions(parts_cmd.out)
    names = [p["PartitionName"] for p in parts]
    if partition:
        chosen = [p for p in parts if p["PartitionName"] == partition]
        if not chosen:
            return CheckResult(
                "partition",
                "fail",
                f"partition {partition!r} not found",
                f"use one of: {', '.join(names) or 'none defined'}",
            )
    else:
        chosen = [p for p in parts if p.get("Default", "").upper() == "YES"]
        if not chosen:
            return CheckResult(
                "partition",
                "warn",
                f"no default partition; have {', '.join(names) or 'none'}",
                "pass --partition (and cluster.partition in the config)",
            )
    return evaluate_partition(parse_scontrol_config(conf.out), chosen[0])


def check_container(kind: str, timeout: float) -> CheckResult:
    if kind == "none":
        return CheckResult("container", "ok", "not requested (bare metal)")
    if kind == "apptainer":
        for exe in ("apptainer", "singularity"):
            if shutil.which(exe):
                cmd = run_cmd([exe, "--version"], timeout)
                if cmd.ok:
                    return CheckResult(
                        "container",
                        "ok",
                        cmd.out.strip() or exe,
                        "compute nodes need it too: --srun checks them",
                    )
                return CheckResult(
                    "container", "fail", f"{exe}: {cmd.reason()}", f"{exe} is installed but broken"
                )
        return CheckResult(
            "container",
            "fail",
            "neither apptainer nor singularity on PATH",
            "module load apptainer, or use --container pyxis/none",
        )
    enroot = shutil.which("enroot")
    help_cmd = run_cmd(["srun", "--help"], timeout)
    pyxis = help_cmd.ok and "--container-image" in help_cmd.out
    bits = [
        f"enroot {'at ' + enroot if enroot else 'missing'}",
        "pyxis " + ("yes (srun --container-image)" if pyxis else "no"),
    ]
    if not help_cmd.ok:
        bits[1] = f"pyxis unknown (srun --help: {help_cmd.reason()})"
    if enroot and pyxis:
        return CheckResult(
            "container", "ok", "; ".join(bits), "compute nodes need both too: --srun checks them"
        )
    return CheckResult(
        "container",
        "fail",
        "; ".join(bits),
        "pyxis needs enroot and the pyxis SPANK plugin (plugstack.conf) on every node; "
        "or use --container apptainer/none",
    )
