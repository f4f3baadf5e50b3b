"""Run every check (concurrently: the torch probe dominates), and the same checks on compute nodes via srun."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from . import image_checks, io_checks, python_env, slurm_checks, storage, torch_stack, wheels
from .results import CheckResult, DoctorDoc, DoctorOptions

REPO_ROOT = (
    Path(__file__).resolve().parents[3]
)  # .../slurmtrain/cli/doctor/runner.py -> checkout root
CONSISTENT = ("python", "torch", "deepspeed", "nccl", "glibc")


def _groups(o: DoctorOptions) -> list[tuple[tuple[str, ...], Callable[[], list[CheckResult]]]]:
    """(names each group yields, the callable) in report order."""
    t = o.command_timeout
    return [
        (("python", "packaging", "venv"), python_env.python_checks),
        (torch_stack.NAMES, lambda: torch_stack.torch_checks(o.probe_timeout)),
        (("glibc",), lambda: [wheels.check_glibc(o.site_paths)]),
        (("slurm_tools",), lambda: [slurm_checks.check_slurm_tools(t)]),
        (("slurm_controller",), lambda: [slurm_checks.check_slurm_controller(t)]),
        (("slurm_accounting",), lambda: [slurm_checks.check_slurm_accounting(t)]),
        (("partition",), lambda: [slurm_checks.check_partition(o.partition, t)]),
        (("container",), lambda: [slurm_checks.check_container(o.container, t)]),
        (("image",), lambda: [image_checks.check_image(o.container, o.image, t, str(o.runs_root))]),
        (("setup",), lambda: [storage.check_setup(o.setup, max(t, 60.0))]),
        (
            ("run_root", "disk_space"),
            lambda: [
                storage.check_run_root(o.runs_root, o.shared_marker),
                storage.check_disk_space(o.runs_root, o.planned_checkpoint_gb),
            ],
        ),
        (
            io_checks.NAMES[:-1],
            lambda: io_checks.io_checks(
                o.runs_root, o.checkpoint_dir, o.io_write_mb_per_s, o.io_read_mb_per_s
            ),
        ),
        (io_checks.NAMES[-1:], lambda: [io_checks.gpu_check()]),
    ]


def check_names() -> list[str]:
    """Every check name, in report order."""
    return [n for names, _ in _groups(DoctorOptions()) for n in names]


def _guarded(names: tuple[str, ...], fn: Callable[[], list[CheckResult]]) -> list[CheckResult]:
    """A check that raises is a doctor bug: report it as failed rows, not a traceback."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the report must finish whatever one check does
        where = traceback.extract_tb(exc.__traceback__)[-1]
        why = (
            f"doctor error {type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
        )
        return [CheckResult(n, "fail", why, "please report this doctor bug") for n in names]


def run_checks(options: Optional[DoctorOptions] = None) -> list[CheckResult]:
    """All checks on this machine, in report order. Never raises, never changes the system."""
    options = options or DoctorOptions()
    groups = _groups(options)
    with ThreadPoolExecutor(len(groups)) as pool:
        futures = [pool.submit(_guarded, names, fn) for names, fn in groups]
        return [r for f in futures for r in f.result()]


@dataclass
class NodeReport:
    node: str
    host: str
    checks: list[CheckResult] = field(default_factory=list)


def parse_srun_output(text: str) -> dict[int, DoctorDoc]:
    """`srun --label` stdout -> {task: the doctor JSON it printed}. Fragments of a task are rejoined
    without newlines (the JSON has none), so split long lines still parse."""
    chunks: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\s*(\d+): ?(.*)$", line)
        if match:
            chunks.setdefault(int(match.group(1)), []).append(match.group(2))
    docs: dict[int, DoctorDoc] = {}
    for task, parts in sorted(chunks.items()):
        joined = "".join(parts)
        start = joined.find('{"doctor"')
        if start < 0:
            continue
        try:
            docs[task], _ = json.JSONDecoder().raw_decode(joined[start:])
        except ValueError:
            continue
    return docs


def comparable(value: str) -> str:
    """A value with its timings removed, for comparing nodes."""
    return re.sub(r"import [\d.]+ s", "import", value)


def consistency(login: list[CheckResult], nodes: list[NodeReport]) -> CheckResult:
    """Versions must match across login and compute nodes; timings are ignored."""
    norm = comparable
    rows = {"login": {c.name: norm(c.value) for c in login}}
    rows.update({n.node: {c.name: norm(c.value) for c in n.checks} for n in nodes})
    differ = [name for name in CONSISTENT if len({r.get(name) for r in rows.values()}) > 1]
    if not differ:
        return CheckResult(
            "nodes_consistent",
            "ok",
            f"{', '.join(CONSISTENT)} identical on login + {len(nodes)} node(s)",
        )
    detail = "; ".join(
        f"{name}: " + " vs ".join(sorted({r.get(name) or "-" for r in rows.values()}))[:160]
        for name in differ
    )
    return CheckResult(
        "nodes_consistent",
        "warn",
        detail,
        "login and compute nodes differ: use one venv on "
        "a shared filesystem (or a container) so jobs see what the doctor saw",
    )


def srun_argv(o: DoctorOptions, nodes: int, marker: Optional[Path]) -> list[str]:
    argv = [
        "srun",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--label",
        "--kill-on-bad-exit=0",
        "--job-name=slurmtrain-doctor",
        "--time=10",
    ]
    if o.partition:
        argv.append(f"--partition={o.partition}")
    argv += [
        sys.executable,
        "-m",
        "slurmtrain.cli.doctor",
        "--json",
        "--runs-root",
        str(o.runs_root.expanduser().absolute()),
        "--container",
        o.container,
        "--timeout",
        str(o.command_timeout),
        "--probe-timeout",
        str(o.probe_timeout),
    ]
    if o.partition:
        argv += ["--partition", o.partition]
    if o.planned_checkpoint_gb is not None:
        argv += ["--planned-checkpoint-gb", str(o.planned_checkpoint_gb)]
    if o.image:
        argv += ["--image", o.image]
    if marker is not None:
        argv += ["--shared-marker", str(marker)]
    if o.checkpoint_dir is not None:
        argv += ["--checkpoint-dir", str(o.checkpoint_dir.expanduser().absolute())]
    argv += ["--io-write-mb-per-s", str(o.io_write_mb_per_s)]
    argv += ["--io-read-mb-per-s", str(o.io_read_mb_per_s)]
    return argv


def run_on_nodes(
    o: DoctorOptions, nodes: int, timeout: float
) -> tuple[list[NodeReport], list[CheckResult]]:
    """The same checks on `nodes` compute nodes (one task each). Returns the node reports and srun-level
    failures (no allocation, a task that printed nothing)."""
    marker = _shared_marker(o)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    try:
        proc = subprocess.Popen(
            srun_argv(o, nodes, marker),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            errors="replace",
        )
    except FileNotFoundError:
        return [], [
            CheckResult("srun", "fail", "srun not on PATH", "run the doctor on a Slurm login node")
        ]
    try:
        out, err = _output_within(proc, timeout)
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
    reports = _node_reports(parse_srun_output(out or ""))
    problems: list[CheckResult] = []
    if len(reports) < nodes:
        last = [ln for ln in (err or "").splitlines() if ln.strip()]
        problems.append(
            CheckResult(
                "srun",
                "fail",
                f"{len(reports)}/{nodes} node(s) reported; srun exit "
                f"{proc.returncode}: {last[-1].strip() if last else 'no error text'}",
                "check the partition, `sinfo`, and that this venv path exists on the nodes",
            )
        )
    return reports, problems


def _shared_marker(o: DoctorOptions) -> Optional[Path]:
    """A file the nodes look for to tell whether they see the login node's runs_root (None when
    it cannot be written)."""
    base = storage.existing_ancestor(o.runs_root.expanduser().absolute())
    try:
        fd, name = tempfile.mkstemp(prefix=".slurmtrain-doctor-shared-", dir=base)
        os.close(fd)
    except OSError:
        return None  # the run_root check reports the unwritable root
    return Path(name)


def _output_within(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """srun's stdout and stderr; past `timeout` it is stopped and stderr says why."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # srun cancels its allocation / step on SIGTERM
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        why = f"no result within {timeout:g} s (queue wait? pass a free --partition)"
        return out, f"{err or ''}\n{why}"


def _node_reports(docs: dict[int, DoctorDoc]) -> list[NodeReport]:
    """One report per task that printed its doctor JSON, named by its node (else its task)."""
    return [
        NodeReport(
            str(d.get("node") or d.get("host") or f"task{t}"),
            str(d.get("host", "?")),
            [CheckResult.from_dict(c) for c in d.get("checks", [])],
        )
        for t, d in docs.items()
    ]


def this_node() -> tuple[str, str]:
    host = socket.gethostname()
    return os.environ.get("SLURMD_NODENAME") or host, host
