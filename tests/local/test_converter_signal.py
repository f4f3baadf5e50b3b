"""The universal-checkpoint conversion survives USR2/TERM.

Slurm signals every process of a step (proctrack/cgroup), so the `ds_to_universal` child and its
pool workers get the time-limit warning or the preemption's TERM along with the rank. The child
ignores them, so the conversion completes instead of dying midway, and the rank's own handler
decides: it saves and exits at the first step
boundary, and the next start reuses the conversion.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from slurmtrain.common import checkpoint_format
from slurmtrain.common.events import CheckpointConverted, Failed, Finished, Paused, Signal, Started
from tests.conftest import PYTHON, ledger_of, run_cli, run_dirs, slurmtrain_env

BASE = [
    "train.max_steps=30",
    "train.log_interval=1",
    "checkpoint.interval_steps=10",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
]


def converters(folder: Path) -> list[int]:
    """The converter's processes (the child and its pool workers) working on `folder`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if "ds_to_universal" in cmd and str(folder) in cmd:
            pids.append(int(proc.name))
    return pids


def test_signal_during_a_world_size_conversion_does_not_kill_it(workdir):
    paused = run_cli(BASE + ["train.pause_at_step=20"], cwd=workdir)
    [run] = run_dirs(workdir / "runs")
    assert ledger_of(run, Paused), paused.stdout + paused.stderr
    step_dir = run / "checkpoints" / "step_20"

    proc = subprocess.Popen(
        [PYTHON, "-m", "slurmtrain", *BASE, "cluster.cpu_tasks_per_node=1"],
        cwd=workdir,
        env=slurmtrain_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline, found = time.time() + 300, []
    while time.time() < deadline and not found:
        assert proc.poll() is None, proc.communicate()
        found = converters(step_dir)
        time.sleep(0.02)
    assert found, "the conversion never started"
    [started] = [e for e in ledger_of(run, Started) if e.world_size == 1]
    for pid in [*started.pids, *converters(step_dir)]:  # what Slurm's cgroup delivery does
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            pass
    out, _ = proc.communicate(timeout=300)

    [converted] = ledger_of(run, CheckpointConverted)
    assert converted.step == 20 and converted.cached is False, out
    universal = run / "checkpoints" / "step_20_universal"
    assert checkpoint_format.validate(universal, full=True) is None
    [sig] = ledger_of(run, Signal)
    assert sig.signal == "SIGUSR2"
    assert not ledger_of(run, Failed), out

    again = run_cli(BASE + ["cluster.cpu_tasks_per_node=1"], cwd=workdir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert ledger_of(run, Finished)
