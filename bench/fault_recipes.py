"""The faults of bench/fault_matrix.py: how each one is produced on the real cluster.

Each recipe submits a short opt_tiny run through `python -m slurmtrain` (a `Trial`,
bench/fault_trial.py), produces its fault the way tests/cluster does, and returns (expected end,
expected class or event).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_recipes_local import LOCAL_FAULTS  # noqa: E402
from fault_trial import (  # noqa: E402
    BASE,
    CANCELLED,
    FINISHED,
    REFUSED,
    ROOT,
    STOPPED,
    Expect,
    Trial,
    Want,
    harness,
    kill_node,
    left_queue,
    rank1,
    sh,
    squeue_state,
)

from slurmtrain.common import events  # noqa: E402  (fault_trial put the repository on the path)
from slurmtrain.common.events import FailureClass  # noqa: E402

# --- the faults: each produces the fault on a trial and returns the run's expected end ---------


def time_limit(t: Trial) -> tuple[str, Want]:
    t.submit(
        [
            "cluster.time=2",
            "cluster.signal_lead_s=30",
            "train.max_steps=130",
            "checkpoint.interval_steps=20",
        ],
        inject="step_delay=0.8",
    )
    return FINISHED, FailureClass.timed_out


def preemption(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=40"], inject="step_delay=0.5")
    t.wait_step(6)
    sh(
        "sbatch",
        "--parsable",
        "-p",
        "high",
        "-N4",
        "--exclusive",
        "--output=/dev/null",
        "--job-name=st-fm-hog",
        "--wrap",
        "sleep 3",
    )
    return FINISHED, FailureClass.preempted


def node_failure(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=40"], inject="step_delay=0.5")
    t.wait_step(12)
    victim, rank_pid = rank1(t.of(events.Started)[-1])
    kill_node(t, victim, [rank_pid])
    return FINISHED, FailureClass.node_failure


def sigkill_mid_save(t: Trial) -> tuple[str, Want]:
    t.submit([], inject="kill_during_save=20,attempts=1")
    return FINISHED, Expect.first_attempt_failed


def corrupt_newest_checkpoint(t: Trial) -> tuple[str, Want]:
    t.paused_at_20()
    t.flip(20)
    t.submit([])
    return FINISHED, events.CheckpointSkipped


def all_checkpoints_corrupt(t: Trial) -> tuple[str, Want]:
    t.paused_at_20()
    t.flip(10)
    t.flip(20)
    t.submit([])
    return STOPPED, FailureClass.checkpoint_unreadable


def run_dir_of(t: Trial, args: list[str]) -> Path:
    """Where `python -m slurmtrain` will train these args: from the config its dry run prints."""
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
    from omegaconf import DictConfig, OmegaConf

    from slurmtrain.common.rundir import fingerprint

    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    dry = subprocess.run(
        [sys.executable, "-m", "slurmtrain", *BASE, f"name={t.name}", *args, "dry_run=true"],
        cwd=t.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the dry run writes the resolved config and prints its path after the plan
    written = re.search(r"full config \(or --cfg job\):\s+(\S+)", dry.stdout)
    printed = yaml.safe_load(Path(written[1]).read_text()) if written else None
    if not isinstance(printed, dict):
        raise RuntimeError(f"dry run printed no config: {dry.stdout[-800:]}{dry.stderr[-800:]}")
    cfg: DictConfig = OmegaConf.create(printed)
    return Path(str(cfg.runs_root), str(cfg.name), fingerprint(cfg))


def disk_full_on_save(t: Trial) -> tuple[str, Want]:
    # A 4 MB tmpfs as the run's checkpoints/: one checkpoint fits, the next does not (ENOSPC).
    ckpts = run_dir_of(t, ["train.max_steps=40"]) / "checkpoints"
    ckpts.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4M", "tmpfs", str(ckpts)]).returncode:
        raise RuntimeError("cannot mount a tmpfs (needs root)")
    t.cleanup.append(lambda: subprocess.run(["umount", "-l", str(ckpts)]))
    t.submit(["train.max_steps=40"])
    t.wait_event(events.CheckpointFailed)
    subprocess.run(["mount", "-o", "remount,size=64M", "tmpfs", str(ckpts)])  # space freed
    return FINISHED, events.CheckpointFailed


def hang_on_one_rank(t: Trial) -> tuple[str, Want]:
    t.culprit_rank = t.index % 2  # rank 1, then rank 0: the verdict must not just name node 2
    t.submit(
        ["faults.hang_timeout_s=15", "train.max_steps=20"],
        inject=f"stall_at_step=8,stall_rank={t.culprit_rank},attempts=1",
    )
    return FINISHED, FailureClass.hang


def nan_loss(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=40"], inject="nan_at_step=15,attempts=1")
    return FINISHED, events.Rollback


def bad_node(t: Trial) -> tuple[str, Want]:
    t.culprit_rank = t.index % 2
    t.submit(["train.max_steps=10"], inject=f"bad_rank={t.culprit_rank},attempts=1")
    return FINISHED, events.BadNode


def node_never_joins(t: Trial) -> tuple[str, Want]:
    # rank 1 wedges before the rendezvous (SIGSTOP), once: its node is named and excluded
    t.submit(["faults.startup_timeout_s=30", "train.max_steps=10"], inject="absent_rank=1")
    return FINISHED, FailureClass.hang


def gpus_invisible(t: Trial) -> tuple[str, Want]:
    # the gpu partition's nodes advertise 8 GPUs their tasks cannot see: each node is named and
    # excluded, retried once, then the run stops no_nodes instead of taking turns on them
    t.submit(["cluster.partition=gpu", "gpus_per_node=8"])
    return STOPPED, FailureClass.no_nodes


def crash_loop(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=20"], inject="crash_at_step=7")
    return STOPPED, FailureClass.crash


def user_error(t: Trial) -> tuple[str, Want]:
    # every rank raises the same error (the user's code or data), once: the run stops, and the
    # verdict blames no node (bench/fault_culprit.py)
    t.submit(["train.max_steps=20", "faults.max_crash=0"], inject="crash_at_step=3")
    return STOPPED, FailureClass.crash


def world_size_change(t: Trial) -> tuple[str, Want]:
    batch = ["train.global_batch_size=8", "train.micro_batch_size=4"]  # same run on 1 or 2 nodes
    t.paused_at_20(batch)
    t.submit([*batch, "nodes=1"])  # 2 ranks -> 1: universal conversion, grad accumulation 2
    return FINISHED, events.CheckpointConverted


def duplicate_submission(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=40"], inject="step_delay=0.3")
    t.wait_step(5)
    sh("sbatch", "--parsable", str(t.path / "job.sbatch"))
    return FINISHED, events.DuplicateRefused


def controller_restart(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=60", "checkpoint.interval_steps=5"], inject="step_delay=0.5")
    t.wait_step(8)
    harness("restart-ctld", "--down-s", "15")
    return FINISHED, Expect.nothing_failed


def sigterm_batch_shell(t: Trial) -> tuple[str, Want]:
    t.submit(["train.max_steps=40"], inject="step_delay=0.5")
    t.wait_step(8)
    job = str(t.of(events.Started)[-1].job_id)
    sh("scancel", "--batch", "--signal=TERM", job)
    return FINISHED, Expect.nothing_failed


def hand_job_then_cancel(t: Trial) -> tuple[str, Want]:
    # a hand `sbatch job.sbatch` pending behind the run, then `cli cancel`:
    # every job of the run leaves the queue and nothing trains afterwards
    t.submit(["train.max_steps=200"], inject="step_delay=0.5")
    t.wait_step(3)
    first = str(t.of(events.Submitted)[-1].job_id)
    hand = sh("sbatch", "--parsable", f"--dependency=afterany:{first}", str(t.path / "job.sbatch"))
    assert squeue_state(hand) == "PENDING", f"hand job {hand}: {squeue_state(hand)!r}"
    out = subprocess.run(
        [sys.executable, "-m", "slurmtrain.cli", "cancel", str(t.path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and hand in out.stdout, out.stdout + out.stderr
    time.sleep(30)  # long enough for a missed job to start and a supervisor to resubmit
    left = [j for j in (first, hand) if squeue_state(j)]
    ev = t.events()
    at = max(i for i, e in enumerate(ev) if isinstance(e, events.Cancelled))
    # the cancelled job saves on its SIGTERM (checkpoints are kept); no other job may start
    later = {
        e.event
        for e in ev[at + 1 :]
        if isinstance(e, (events.Started, events.Submitted))
        or (isinstance(e, events.CheckpointSaved) and e.job_id != first)
    }
    assert not left and not later, f"after cancel: queued {left}, ledger {sorted(later)}"
    t.notes.append(f"cancelled {first} and hand job {hand}")
    t.ended = CANCELLED
    return CANCELLED, FailureClass.cancelled


def inject_without_opt_in(t: Trial) -> tuple[str, Want]:
    # SLURMTRAIN_INJECT without faults.allow_inject=true is refused at submit
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env["SLURMTRAIN_INJECT"] = "crash_at_step=3"
    done = subprocess.run(
        [sys.executable, "-m", "slurmtrain", *BASE, f"name={t.name}"],
        cwd=t.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = [line for line in done.stderr.splitlines() if "SLURMTRAIN_INJECT" in line]
    assert done.returncode == 2 and len(said) == 1, done.stdout + done.stderr
    assert not (t.workdir / "runs").exists(), "a refused submission wrote a run directory"
    t.ended = REFUSED
    return REFUSED, Expect.nothing_failed


def load_failure(t: Trial) -> tuple[str, Want]:
    # step_20 validates (its manifest rewritten over bytes DeepSpeed rejects, as a buggy writer
    # would) but does not load: marked, and step_10 loaded in the same attempt
    import json

    import torch

    from slurmtrain.common.checkpoint_format import CHECKSUM, MANIFEST, _digest

    t.paused_at_20()
    step = t.path / "checkpoints" / "step_20"
    states = step / "mp_rank_00_model_states.pt"
    torch.save({"not": "a DeepSpeed checkpoint"}, states)
    manifest = json.loads((step / MANIFEST).read_text())
    manifest["files"][states.name].update(size=states.stat().st_size, **{CHECKSUM: _digest(states)})
    (step / MANIFEST).write_text(json.dumps(manifest, indent=1))
    t.corrupted.add(step.name)
    t.submit([])
    return FINISHED, events.CheckpointUnloadable


def converter_signal(t: Trial) -> tuple[str, Want]:
    # the time-limit USR2 reaches every process of the step while ds_to_universal converts
    # (2 ranks -> 1): the conversion completes, the rank saves and is requeued, the run finishes
    from slurmtrain.common.checkpoint_format import validate

    batch = ["train.global_batch_size=8", "train.micro_batch_size=4"]
    t.paused_at_20(batch)
    t.submit([*batch, "nodes=1"])
    source = str(t.path / "checkpoints" / "step_20")
    t.wait(lambda: source in sh("pgrep", "-af", "ds_to_universal"), 300, "the conversion")
    sh("scancel", "--signal=USR2", str(t.of(events.Submitted)[-1].job_id))
    if t.wait_end() == FINISHED:
        bad = validate(t.path / "checkpoints" / "step_20_universal", full=True)
        if bad is not None:
            raise RuntimeError(f"universal checkpoint corrupt: {bad}")
    return FINISHED, events.CheckpointConverted


def final_step_signal(t: Trial) -> tuple[str, Want]:
    # USR2 during step 30 of 30: the stop's save is the final checkpoint; finished, no extra job
    t.submit([], inject="step_delay=2")
    t.wait_step(29)
    sh("scancel", "--signal=USR2", str(t.of(events.Submitted)[-1].job_id))
    if t.wait_end() == FINISHED and len(t.of(events.Started)) != 1:
        raise RuntimeError(f"{len(t.of(events.Started))} attempts: the signal cost an extra job")
    return FINISHED, events.Signal


def resubmit_after_stop(t: Trial) -> tuple[str, Want]:
    # a crash loop stops the run; the user "fixes" it (no injection) and runs the same command:
    # a new budget window opens and the run finishes
    t.submit(["train.max_steps=20"], inject="crash_at_step=7")
    job = str(t.wait_event(events.Stopped, timeout=600).job_id)
    t.wait(left_queue(job), 120, f"job {job} to end")
    t.submit(["train.max_steps=20"])
    t.wait_event(events.Finished, timeout=900)
    return FINISHED, events.BudgetWindow


def held_successor(t: Trial) -> tuple[str, Want]:
    # the supervisor "dies" between recording its held successor and releasing it; `status`
    # past the bound (SLURMTRAIN_HELD_OWNER_S) releases it and the run finishes
    t.submit(["train.max_steps=20"], inject="crash_at_step=7,attempts=1,skip_release=1")
    t.wait(lambda: any(e.requeue_of for e in t.of(events.Submitted)), 600, "successor")
    time.sleep(8)
    env = dict(os.environ, PYTHONPATH=str(ROOT), SLURMTRAIN_HELD_OWNER_S="5")
    status = [sys.executable, "-m", "slurmtrain.cli", "status", str(t.path)]
    subprocess.run(status, env=env, capture_output=True, text=True, timeout=300)
    return FINISHED, FailureClass.crash


def supervisor_exception(t: Trial) -> tuple[str, Want]:
    # the supervisor raises after a crash: its catch-all records it and resubmits
    t.submit(["train.max_steps=20"], inject="crash_at_step=7,attempts=1,supervisor_raise=1")
    return FINISHED, events.SupervisorFailed


FAULTS: dict[str, Callable[[Trial], tuple[str, Want]]] = {
    "time_limit": time_limit,
    "preemption": preemption,
    "node_failure": node_failure,
    "sigkill_mid_save": sigkill_mid_save,
    "corrupt_newest_checkpoint": corrupt_newest_checkpoint,
    "all_checkpoints_corrupt": all_checkpoints_corrupt,
    "disk_full_on_save": disk_full_on_save,
    "hang_on_one_rank": hang_on_one_rank,
    "nan_loss": nan_loss,
    "bad_node": bad_node,
    "node_never_joins": node_never_joins,
    "gpus_invisible": gpus_invisible,
    "crash_loop": crash_loop,
    "user_error": user_error,
    "world_size_change": world_size_change,
    "duplicate_submission": duplicate_submission,
    "controller_restart": controller_restart,
    "sigterm_batch_shell": sigterm_batch_shell,
    "hand_job_then_cancel": hand_job_then_cancel,
    "inject_without_opt_in": inject_without_opt_in,
    "load_failure": load_failure,
    "converter_signal": converter_signal,
    "final_step_signal": final_step_signal,
    "resubmit_after_stop": resubmit_after_stop,
    "held_successor": held_successor,
    "supervisor_exception": supervisor_exception,
    **LOCAL_FAULTS,
}
