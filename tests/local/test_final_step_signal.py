"""A stop signal in the run's final step finishes the run: the last step's
checkpoint is the final one, so the attempt records `finished` instead of asking for another job
whose only work would be to load it and stop.

The flag raised during the last step does not make the attempt exit EXIT_REQUEUE without a
`finished` row, which would cost a whole extra job (queue wait, start-up, load) to record it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from slurmtrain.common.events import CheckpointSaved, Finished, Requeued, Signal, Started
from tests.conftest import PYTHON, ledger_events, read_jsonl, slurmtrain_env

MAX = 12
ARGS = ["cluster=local", f"train.max_steps={MAX}", "train.log_interval=1"]
ARGS += ["checkpoint.interval_steps=1000"]  # only the final save


def test_signal_in_the_final_step_finishes_the_run_without_another_attempt(workdir):
    # 3 s per step: the signal sent once step MAX-1 is logged lands inside step MAX.
    env = slurmtrain_env({"SLURMTRAIN_INJECT": "step_delay=3"})
    proc = subprocess.Popen(
        [PYTHON, "-m", "slurmtrain", *ARGS, "faults.allow_inject=true"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline, run = time.time() + 400, None
    while time.time() < deadline and run is None:
        assert proc.poll() is None, proc.communicate()
        found = list((workdir / "runs").glob("*/*/metrics.jsonl"))
        if found and any(r["step"] >= MAX - 1 for r in read_jsonl(found[0])):
            run = found[0].parent
        time.sleep(0.05)
    assert run is not None, f"never reached step {MAX - 1}"
    [started] = [e for e in ledger_events(run) if isinstance(e, Started)]
    os.kill(started.pids[1], signal.SIGUSR2)  # the time-limit warning, on one rank
    out, _ = proc.communicate(timeout=300)
    rows = ledger_events(run)
    kinds = [type(e) for e in rows]
    [sig] = [e for e in rows if isinstance(e, Signal)]
    assert sig.signal == "SIGUSR2" and sig.step == MAX, out
    assert Finished in kinds, out
    [saved] = [e for e in rows if isinstance(e, CheckpointSaved)]
    assert saved.step == MAX
    assert kinds.count(Started) == 1 and Requeued not in kinds
    assert proc.returncode == 0, out
