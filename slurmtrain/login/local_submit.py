"""Local backend: submitit's LocalExecutor starts one worker per task on this machine and we wait.

The workers write metrics.jsonl; this side turns it into a rich progress bar (plain lines at least
every PLAIN_EVERY_S when stdout is a file or a pipe), so the same entrypoint runs here and on Slurm. Ctrl-C stops the run the way a preemption does: the workers
agree on a step, save it and exit; a second Ctrl-C kills them (the newest complete checkpoint
stays). submitit's controller would SIGKILL its tasks a second after a Ctrl-C of its own, so it
is started deaf to SIGINT and only relays our SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import submitit
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from slurmtrain.batch import local_close
from slurmtrain.common import events, ledger, secrets
from slurmtrain.common.derived import tasks_per_node
from slurmtrain.common.liveness import pid_start
from slurmtrain.common.resumed import resumed_line
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.local_worker import TrainTask
from slurmtrain.login import flags
from slurmtrain.login.submission import Submission
from slurmtrain.planning.eta import format_duration


def free_port() -> int:
    """A free TCP port on this machine for the local workers' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def submit(cfg: RootConfig, run: RunDir) -> Submission:
    if cfg.gpus_per_node == 0:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    os.environ.update(secrets.job_environment(cfg))  # the workers resolve config.yaml's references
    os.environ.update(flags.local_env(cfg, dict(os.environ)))  # cluster.env, expanded as sbatch's
    executor = submitit.LocalExecutor(folder=str(run.logs / "submitit"))
    executor.update_parameters(
        tasks_per_node=tasks_per_node(cfg),
        gpus_per_node=cfg.gpus_per_node,
        timeout_min=24 * 60,
        nodes=1,
    )
    with _sigint_ignored():  # inherited by the controller; the workers install their own handler
        job = executor.submit(TrainTask(str(run.path), flags.master_port(cfg) or free_port()))
    pid = int(job.job_id)
    run.record(
        events.Submitted(
            executor="local", pid=pid, host=socket.gethostname(), pid_start=pid_start(pid)
        ),
        job_id=job.job_id,
        nodes=[socket.gethostname()],
    )
    print(f"slurmtrain: started local job {job.job_id} in {run.path}")
    interrupted = _follow(run, job, cfg.train.max_steps)
    if interrupted:
        return _stopped_by_user(run, job.job_id)
    try:
        job.results()
        code = 0
    except Exception:  # noqa: BLE001  the workers' traceback is in the ledger and their logs
        code = 1
        rows = run.run_events() + run.rank_rows(job.job_id)  # rank rows: this job's
        failed = [e for e in rows if isinstance(e, events.Failed)]
        failed = ledger.real_errors(failed) or failed  # the cause, not a peer's lost connection
        reason = failed[-1].error if failed else "a worker died (see its log)"
        print(f"slurmtrain: local job {job.job_id} failed: {reason}")
        print(f"slurmtrain: worker logs: {run.logs}/{job.job_id}_*.err")
        local_close.close_failed(run, cfg, str(job.job_id))  # a budget stop: recorded now
    run_rows = run.run_events()
    done = any(isinstance(r, events.Finished) for r in run_rows)
    if done:  # what to do with the model just trained
        _print_sample(run)
        prompt = shlex.quote(sample_prompt(cfg) or "TEXT")
        print(f"sample: python -m slurmtrain.cli sample {run.path} --prompt {prompt}")
        print(f"export: python -m slurmtrain.cli export {run.path} --out exports/{cfg.name}")
    stopped = [e for e in run_rows if isinstance(e, events.Stopped) and e.job_id == str(job.job_id)]
    if stopped:  # diverged, checkpoint_unreadable, a budget: the attempt said why
        print(f"slurmtrain: run stopped ({stopped[-1].cls}): {stopped[-1].error}")
    return Submission(job.job_id, "local", finished=done, exit_code=0 if done else (code or 1))


def sample_prompt(cfg: RootConfig, words: int = 3) -> Optional[str]:
    """A prompt like the training text, for the next-step hint: 'def ' for data=synthetic (Python's
    standard library), the first words of data=text's first document (a .txt or .jsonl file);
    None when the corpus is not text read here (token files, a folder, a blend)."""
    if cfg.data.kind == "synthetic":
        return "def "
    path = cfg.data.path
    if cfg.data.kind != "text" or not path or Path(path).suffix not in (".txt", ".jsonl"):
        return None
    try:
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as f:
            first = next((line for line in f if line.strip()), "")
    except OSError:
        return None
    if Path(path).suffix == ".jsonl":
        try:
            first = str(json.loads(first).get(cfg.data.text_field) or "")
        except (ValueError, AttributeError):
            return None
    found = first.split()[:words]
    return " ".join(found) + " " if found else None


def _print_sample(run: RunDir) -> None:
    """tools/demo.sh's closing sample (SLURMTRAIN_SAMPLE_PROMPT set): the model just trained
    continues the prompt, in a child process so that this login-side one never imports torch."""
    prompt = os.environ.get("SLURMTRAIN_SAMPLE_PROMPT")
    if not prompt:
        return
    cmd = [sys.executable, "-m", "slurmtrain.cli", "sample", str(run.path), "--prompt", prompt]
    done = subprocess.run([*cmd, "--tokens", "400"], capture_output=True, text=True)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"slurmtrain: no sample: {why}")
        return
    print(f"the model's continuation of {prompt!r}:\n{done.stdout.rstrip()}\n")


def _new_rows(path: Path, offset: int) -> tuple[int, list[dict[str, object]]]:
    """The complete lines appended since `offset` (a torn last line waits for the next poll)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset, []
    done = data[: data.rfind(b"\n") + 1]
    rows: list[dict[str, object]] = []
    for line in done.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return offset + len(done), rows


def _step(metrics_row: dict[str, object]) -> Optional[int]:
    """A metrics.jsonl row's step (None when it has none)."""
    step = metrics_row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _stop(run: RunDir, job: submitit.Job, presses: int) -> None:
    """First Ctrl-C: SIGTERM through the controller (the workers save, then exit). Second: SIGKILL
    the workers and the controller."""
    if presses == 1:
        print("\nslurmtrain: Ctrl-C: saving a checkpoint, then stopping (Ctrl-C again: kill now)")
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(job.job_id), signal.SIGTERM)  # the controller forwards it to every task
        return
    started = [
        e for e in run.run_events() if isinstance(e, events.Started) and e.job_id == str(job.job_id)
    ]
    pids = started[-1].pids if started else ()
    print("\nslurmtrain: Ctrl-C again: killing the workers now")
    for pid in [*pids, int(job.job_id)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stopped_by_user(run: RunDir, job_id: str) -> Submission:
    """The attempt is closed `cancelled` (the user's stop, not a failure); the next start resumes."""
    ledger.close_cancelled(run, [str(job_id)], "ctrl-c")
    saved = [e for e in run.run_events() if isinstance(e, events.CheckpointSaved)]
    where = f"checkpoint step_{saved[-1].step}" if saved else "no checkpoint yet"
    print(
        f"slurmtrain: stopped by Ctrl-C ({where}); run the same command again to resume: {run.path}"
    )
    return Submission(job_id, "local", finished=False, exit_code=130)


PLAIN_EVERY_S = 15.0  # stdout not a terminal (a file, a pipe): a progress line at least this often


def progress_line(row: Optional[dict[str, object]], max_steps: Optional[int]) -> str:
    """`train: step 40/200, loss 4.1200, 21,000 tok/s, ETA 0:00:08`: the bar, as one line."""
    if row is None:
        return f"train: step 0/{max_steps or '?'}, starting (no step logged yet)"
    loss, tps, eta = row.get("loss"), row.get("tokens_per_s"), row.get("eta_s")
    parts = [f"train: step {_step(row)}/{max_steps or '?'}"]
    parts += [f"loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
    parts += [f"{tps:,.0f} tok/s"] if isinstance(tps, (int, float)) else []
    parts += [f"ETA {format_duration(eta, clock=True)}"] if isinstance(eta, (int, float)) else []
    return ", ".join(parts)


class _Lines:
    """The progress bar's form when stdout is not a terminal (a rich bar would show nothing until
    the end there): a line on the first logged step, at least every PLAIN_EVERY_S, and at the end."""

    def __init__(self, max_steps: Optional[int]) -> None:
        self.max_steps = max_steps
        self.row: Optional[dict[str, object]] = None  # the newest metrics row
        self.shown: Optional[dict[str, object]] = None  # the row last printed
        self.at = time.monotonic()

    def refresh(self, row: Optional[dict[str, object]], final: bool = False) -> None:
        self.row = row or self.row
        first = self.shown is None and self.row is not None
        due = time.monotonic() - self.at >= PLAIN_EVERY_S
        if first or due or (final and self.row is not self.shown):
            print(progress_line(self.row, self.max_steps), flush=True)
            self.shown, self.at = self.row, time.monotonic()


@contextlib.contextmanager
def _display(
    max_steps: Optional[int],
) -> Iterator[Callable[[Optional[dict[str, object]], bool], None]]:
    """show(row or None, final): a rich bar on a terminal, plain lines (_Lines) otherwise."""
    if not sys.stdout.isatty():
        yield _Lines(max_steps).refresh
        return
    columns = (
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False, auto_refresh=False) as bar:
        task = bar.add_task("train", total=max_steps, loss="-", tps="-")

        def drawn(row: Optional[dict[str, object]], final: bool) -> None:
            if row is not None:
                bar.update(
                    task,
                    completed=_step(row),
                    loss=f"{row['loss']:.4f}",
                    tps=f"{row['tokens_per_s']:,.0f}",
                )
            bar.refresh()

        yield drawn


def _say_resumed(run: RunDir, job_id: str) -> bool:
    """The attempt's `resumed from` line (its workers print theirs in its log) from its
    `checkpoint_loaded` row, aged by the `checkpoint_saved` row of that step; True once said."""
    rows, said = run.run_events(), False
    for row in rows:
        if isinstance(row, events.CheckpointLoaded) and row.job_id == job_id:
            said = True
            saved = [
                r.time for r in rows if isinstance(r, events.CheckpointSaved) and r.step == row.step
            ]
            universal = bool(row.world_size_changed)
            line = resumed_line(
                row.step, row.path, saved[-1] if saved else None, universal=universal
            )
            print(line, flush=True)
    return said


def _follow(run: RunDir, job: submitit.Job, max_steps: Optional[int]) -> bool:
    """Progress fed by metrics.jsonl until the job's processes exit; True after a Ctrl-C.

    This process shares the machine with the workers: it reads only the new lines and redraws
    twice a second (no 10 Hz refresh thread), so following a long run costs next to nothing.
    """
    with _display(max_steps) as show:
        offset = run.metrics.stat().st_size if run.metrics.exists() else 0  # this job's rows
        presses, tries = 0, 3  # `resumed from`: looked for on the first polls with rows
        while True:
            try:
                exited = job.done()  # checked before the read, so the last rows are always shown
                offset, rows = _new_rows(run.metrics, offset)
                if (rows or exited) and tries:  # the checkpoint is loaded before step 1
                    tries = 0 if _say_resumed(run, str(job.job_id)) else tries - 1
                show(rows[-1] if rows else None, exited)
                if exited:
                    return presses > 0
                time.sleep(0.5)
            except KeyboardInterrupt:
                presses += 1
                _stop(run, job, presses)
