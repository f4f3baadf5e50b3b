"""The stop signal is recorded when the ranks agree to stop, before their save:
a save that outlasts Slurm's GraceTime still leaves the record that classifies the attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from slurmtrain.common.events import CheckpointSaved, Signal, Started
from tests.conftest import PYTHON, ledger_events, read_jsonl, slurmtrain_env

FAST = ["train.max_steps=200", "train.log_interval=1", "checkpoint.interval_steps=100"]


def test_signal_is_recorded_before_the_stop_save(workdir):
    env = slurmtrain_env({"SLURMTRAIN_INJECT": "step_delay=0.1"})
    proc = subprocess.Popen(
        [PYTHON, "-m", "slurmtrain", *FAST, "cluster=local", "faults.allow_inject=true"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 300
    ledger = None
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        found = list((workdir / "runs").glob("*/*/metrics.jsonl"))
        if found and any(r["step"] >= 5 for r in read_jsonl(found[0])):
            ledger = found[0].parent
            break
        time.sleep(0.1)
    assert ledger is not None, "never reached step 5"
    [started] = [e for e in ledger_events(ledger) if isinstance(e, Started)]
    os.kill(started.pids[1], signal.SIGUSR2)  # rank 1 only: the ranks agree on it
    proc.communicate(timeout=300)
    rows = ledger_events(ledger)
    kinds = [type(e) for e in rows]
    [sig] = [e for e in rows if isinstance(e, Signal)]
    assert sig.signal == "SIGUSR2" and sig.before_save is True
    saved = [i for i, e in enumerate(rows) if isinstance(e, CheckpointSaved)]
    assert saved and kinds.index(Signal) < saved[-1]
    assert rows[saved[-1]].step == sig.step
