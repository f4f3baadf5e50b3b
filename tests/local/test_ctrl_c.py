"""Ctrl-C on a local run stops it the way a preemption does: the workers agree on a step, save it
and exit; the attempt is closed `cancelled`; running the same command again resumes from there.

The terminal's SIGINT must not reach submitit's controller, which would SIGKILL the workers a
second later (KeyboardInterrupt tracebacks, nothing saved since the last periodic checkpoint, the
attempt left open).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from slurmtrain.common.events import (
    AttemptEnded,
    CheckpointLoaded,
    CheckpointSaved,
    FailureClass,
    Finished,
    Signal,
    Started,
)
from tests.conftest import PYTHON, ledger_events, read_jsonl, run_cli, slurmtrain_env

ARGS = ["cluster=local", "train.max_steps=120", "train.log_interval=1"]
ARGS += ["checkpoint.interval_steps=1000"]  # no periodic save: only the stop's save remains


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_saves_the_agreed_step_closes_the_attempt_and_the_rerun_resumes(workdir):
    env = slurmtrain_env({"SLURMTRAIN_INJECT": "step_delay=0.1"})
    proc = subprocess.Popen(
        [PYTHON, "-m", "slurmtrain", *ARGS, "faults.allow_inject=true"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline, run = time.time() + 300, None
    while time.time() < deadline and run is None:
        assert proc.poll() is None, proc.communicate()
        found = list((workdir / "runs").glob("*/*/metrics.jsonl"))
        if found and any(r["step"] >= 10 for r in read_jsonl(found[0])):
            run = found[0].parent
        time.sleep(0.1)
    assert run is not None, "never reached step 10"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    rows = ledger_events(run)
    [sig] = [e for e in rows if isinstance(e, Signal)]
    [saved] = [e for e in rows if isinstance(e, CheckpointSaved)]
    assert sig.signal == "SIGINT" and saved.step == sig.step >= 10
    [ended] = [e for e in rows if isinstance(e, AttemptEnded)]
    assert ended.cls == FailureClass.cancelled and ended.closed_by == "ctrl-c"
    assert f"stopped by Ctrl-C (checkpoint step_{sig.step})" in out
    [started] = [e for e in rows if isinstance(e, Started)]
    assert not any(_alive(pid) for pid in started.pids)

    again = run_cli(ARGS, cwd=workdir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming unfinished run" in again.stdout
    rows = ledger_events(run)
    [loaded] = [e for e in rows if isinstance(e, CheckpointLoaded)]
    assert loaded.step == sig.step and loaded.attempt == 2
    assert isinstance(rows[-1], Finished)
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["attempt"] == 2]
    assert steps == list(range(sig.step + 1, 121))  # nothing lost, nothing trained twice
