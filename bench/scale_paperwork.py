"""A big run's paperwork, read: wall time and peak open files of `status`, `logs`, one supervisor
decision and one claim, at 8 to 4,096 ranks x 1 to 100 attempts.

    python bench/scale_paperwork.py [--quick] [--layout tiered|flat]

Each run directory is synthetic but laid out as the writers lay it out (common/jsonl.py): the run
tier (login, rank 0 and supervisor files per attempt), the rank tier (one file per node of each
failed start; `--layout flat`: one file per failing rank, as before the rank tier), metrics and
the last job's rank logs. Every attempt fails or is preempted; the last one is an all-rank failure
with one real error and every other rank's peer error. Each command runs in a child process under
RLIMIT_NOFILE=64 (it fails if it needs more) while the parent samples /proc/<pid>/fd; the time is
the call's own (imports excluded). Goal: each under 2 s at 4,096 x 100, open files <= 64.
`make_paperwork` also builds the scale drill's paperwork (tests/unit/test_scale_paperwork.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurmtrain.common import events  # noqa: E402
from slurmtrain.common.events import FailureClass  # noqa: E402

T0 = 1.0e9  # the first submission's time
GPUS = 8
REAL = "ValueError: synthetic real error: logits and labels differ in shape (4096 vs 4095)"
PEER = "RuntimeError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
STEPS = 10  # metrics rows per attempt


def _write(path: Path, rows: Sequence[events.Row]) -> None:
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))


@dataclass(frozen=True)
class Shape:
    """A synthetic run's shape: its nodes, each rank's host, the rank whose error is real."""

    nodes: list[str]
    hosts: list[str]
    real_rank: int
    layout: str

    @property
    def ranks(self) -> int:
        return len(self.hosts)


def make_paperwork(
    root: Path, ranks: int, attempts: int, layout: str = "tiered", logs: bool = True
) -> dict[str, Any]:
    """A finished-by-failure run of `ranks` ranks (8 a node) and `attempts` attempts under `root`;
    returns the run directory and the answers its readers must give."""
    nodes = [f"n{i:04d}" for i in range(max(1, ranks // GPUS))]
    shape = Shape(nodes, [nodes[r // GPUS] for r in range(ranks)], ranks // 3, layout)
    run = root / "scale" / f"r{ranks}a{attempts}{layout[0]}"
    ledger, metrics_rows = run / "ledger.d", []
    (ledger / "ranks").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "config.yaml").write_text("name: scale\nfaults:\n  spare_nodes: 0\n")
    first = events.Submitted(
        time=T0, job_id="1001", host="login-elsewhere", executor="local", pid=1
    )
    _write(ledger / "login.100.aaaaaa.jsonl", [first])
    for a in range(1, attempts + 1):
        job, t = str(1000 + a), T0 + a * 1000.0
        metrics_rows += _metrics(a, t)
        failed = _failed(shape, a, attempts, t)
        zero = _rank0(shape, a, t, failed)
        _write(ledger / f"{nodes[0]}.{10000 + a}.r0{a:04d}.jsonl", zero)
        sup = _supervisor(shape, a, t, failed, last=a == attempts)
        _write(ledger / f"batch.{20000 + a}.sv{a:04d}.jsonl", sup)
        by_file: dict[Path, list[events.Row]] = {}
        for row in failed:
            if layout == "tiered":
                path = ledger / "ranks" / f"{job}.0.0" / f"{row.node}.jsonl"
            else:  # before the rank tier: one file per failing process
                path = ledger / f"{row.node}.{30000 + (row.rank or 0)}.f{a:05d}.jsonl"
            by_file.setdefault(path, []).append(row)
        for path, rows in by_file.items():
            path.parent.mkdir(exist_ok=True)
            _write(path, rows)
    metrics_rows[-3]["valid_loss"] = 3.25  # the last attempt's
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics_rows))
    if logs:
        job = str(1000 + attempts)
        for r in range(ranks):
            text = f"rank {r} on {shape.hosts[r]}: step 1\nrank {r}: step 2\n"
            text += (
                f"Traceback (most recent call last):\n{REAL if r == shape.real_rank else PEER}\n"
            )
            (run / "logs" / f"{job}_{r}.out").write_text(text)
    return {
        "run": str(run),
        "job_id": str(1000 + attempts),
        "attempts": attempts,
        "step": metrics_rows[-1]["step"],
        "valid_loss": 3.25,
        "error": REAL,
        "real_rank": shape.real_rank,
        "ranks": ranks,
    }


def _metrics(a: int, t: float) -> list[dict[str, Any]]:
    """Attempt `a`'s metrics.jsonl rows (plain dicts: metrics are no ledger rows)."""
    return [
        {
            "step": (a - 1) * STEPS + s + 1,
            "loss": 5.0 - a * 0.01,
            "time": t + 10 + s,
            "attempt": a,
            "step_time": 1.0,
            "tokens_per_s": 1e6,
        }
        for s in range(STEPS)
    ]


def _rank0(shape: Shape, a: int, t: float, failed: list[events.Failed]) -> list[events.Row]:
    """Rank 0's file of attempt `a`: its start, load and save; a signal if nothing failed."""
    job = str(1000 + a)
    zero: list[events.Row] = [
        events.Started(
            time=t + 1,
            job_id=job,
            attempt=a,
            nodes=tuple(shape.nodes),
            restart=0,
            relaunch=0,
            executor="local",
            world_size=shape.ranks,
            hosts=tuple(shape.hosts),
            pids=tuple(range(50000, 50000 + shape.ranks)),
            rank=0,
            node=shape.nodes[0],
        ),
        events.RendezvousDone(time=t + 2, job_id=job, attempt=a, seconds=1.0),
        events.CheckpointLoaded(
            time=t + 3, job_id=job, attempt=a, step=(a - 1) * STEPS, seconds=1.0
        ),
        events.CheckpointSaved(
            time=t + 50, job_id=job, attempt=a, step=a * STEPS, seconds=2.0, bytes=1 << 30
        ),
    ]
    if not failed:
        zero.append(events.Signal(time=t + 60, job_id=job, attempt=a, signal="SIGTERM"))
    return zero


def _failed(shape: Shape, a: int, attempts: int, t: float) -> list[events.Failed]:
    """Attempt `a`'s `failed` rows: every rank's in the last one (one real error, the rest its
    peers'), one rank's in every odd one, none in the others (preempted)."""
    job = str(1000 + a)
    if a == attempts:
        return [
            events.Failed(
                time=t + 60 + r * 1e-4,
                job_id=job,
                attempt=a,
                # as the writers did: the attempt's nodes before the rank tier, its own now
                nodes=(shape.hosts[r],) if shape.layout == "tiered" else tuple(shape.nodes),
                rank=r,
                node=shape.hosts[r],
                restart=0,
                relaunch=0,
                cls=FailureClass.crash,
                error=REAL if r == shape.real_rank else PEER,
            )
            for r in range(shape.ranks)
        ]
    if a % 2 == 0:
        return []
    r = (a * 7) % shape.ranks
    error = f"KeyError: synthetic {a}"
    return [
        events.Failed(
            time=t + 60,
            job_id=job,
            attempt=a,
            rank=r,
            node=shape.hosts[r],
            cls=FailureClass.crash,
            error=error,
        )
    ]


def _supervisor(
    shape: Shape, a: int, t: float, failed: list[events.Failed], last: bool
) -> list[events.Row]:
    """The supervisor's file of attempt `a`: how it ended, then the stop (the last attempt) or
    the next job."""
    job, nodes = str(1000 + a), tuple(shape.nodes)
    cls = FailureClass.crash if failed else FailureClass.preempted
    ended = events.AttemptEnded(
        time=t + 100, job_id=job, attempt=a, nodes=nodes, cls=cls, exit_code=1
    )
    if last:
        stop = events.Stopped(
            time=t + 101, job_id=job, attempt=a, cls=FailureClass.crash, error=REAL
        )
        return [ended, stop]
    nxt = str(1001 + a)
    return [
        ended,
        events.Resubmitting(time=t + 101, job_id=job, attempt=a, reason=cls),
        events.Submitted(
            time=t + 102, job_id=nxt, executor="local", host="login-elsewhere", requeue_of=job
        ),
        events.Requeued(time=t + 103, job_id=job, attempt=a, new_job_id=nxt),
    ]


# ---- one command, in a child process ---------------------------------------------------------

CHILD = r"""
import io, json, os, runpy, sys, time, contextlib
cmd, run, job, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "count"
from pathlib import Path
from slurmtrain.common.rundir import RunDir
from slurmtrain.batch import supervise
from slurmtrain.cli import status
from slurmtrain.compute.faults import owner
peak = [0]
def hook(event, args):  # every open of the call: the descriptors already open, plus this one
    if event in ("open", "os.open"):
        peak[0] = max(peak[0], len(os.listdir("/proc/self/fd")))  # (listdir's own fd included)
if count:
    sys.addaudithook(hook)
out = io.StringIO()
t, cpu = time.perf_counter(), time.process_time()
answer = None
if cmd == "status":
    with contextlib.redirect_stdout(out):
        status.main(["--json", run])
    answer = json.loads(out.getvalue().splitlines()[-1])["error"]
elif cmd == "logs":
    sys.argv = ["logs", run]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module("slurmtrain.cli.logs", run_name="__main__")
        except SystemExit:
            pass
    answer = len(out.getvalue().splitlines())
elif cmd == "supervisor":
    answer = supervise.verdict_of(RunDir(Path(run)), job, 0, 0, 1, [], 0.0).cls
elif cmd == "claim":
    answer = owner.check(RunDir(Path(run)), {job})[0]
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
print(json.dumps({"seconds": wall, "cpu": cpu, "answer": answer, "peak": peak[0]}))
"""
COMMANDS = ("status", "logs", "supervisor", "claim")


def measure(cmd: str, info: dict[str, Any], repeat: int, nofile: int = 64) -> dict[str, Any]:
    """The fastest of `repeat` timed runs (this machine is shared); the peak open files from one
    more run that counts the descriptors open at each open() (an audit hook: exact, but slow)."""
    counted = measure_once(cmd, info, nofile, count=True)
    runs = [measure_once(cmd, info, nofile) for _ in range(repeat)]
    failed = [r for r in [counted, *runs] if r["seconds"] is None]
    if failed:
        return failed[0]
    best = min(runs, key=lambda r: r["seconds"])
    cpu = min(r["cpu"] for r in runs)
    return {**best, "cpu": cpu, "peak": max(r["peak"] for r in [counted, *runs])}


def measure_once(
    cmd: str, info: dict[str, Any], nofile: int, count: bool = False
) -> dict[str, Any]:
    """(seconds, peak open fds, answer) of one command on one run, in a child under `nofile`;
    the parent also samples /proc/<pid>/fd every 2 ms."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def limit() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, cmd, info["run"], info["job_id"], "count" if count else "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=limit,
    )
    peak, fd_dir = 0, f"/proc/{proc.pid}/fd"
    while proc.poll() is None:
        try:
            peak = max(peak, len(os.listdir(fd_dir)))
        except OSError:
            pass
        time.sleep(0.002)
    out, err = proc.communicate()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:]
        return {"seconds": None, "peak": peak, "answer": f"FAILED: {tail}"}
    got = json.loads(out.decode().strip().splitlines()[-1])
    return {**got, "peak": max(peak, got["peak"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8, 512, 4096 ranks x 1, 100")
    parser.add_argument("--layout", default="tiered", choices=("tiered", "flat"))
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the fastest)")
    args = parser.parse_args()
    ranks = (8, 512, 4096) if args.quick else (8, 64, 512, 4096)
    attempts = (1, 100) if args.quick else (1, 10, 100)
    results: dict[tuple[int, int, str], dict[str, Any]] = {}
    print(f"layout {args.layout}; each command under RLIMIT_NOFILE=64; seconds of the call")
    header = f"{'ranks':>6} {'attempts':>8} " + " ".join(f"{c:>20}" for c in COMMANDS)
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for r in ranks:
            for a in attempts:
                t = time.perf_counter()
                info = make_paperwork(Path(tmp) / f"{r}x{a}", r, a, args.layout)
                made = time.perf_counter() - t
                cells = []
                for cmd in COMMANDS:
                    m = results[(r, a, cmd)] = measure(cmd, info, args.repeat)
                    if m["seconds"] is None:
                        cells.append(f"{'FAIL':>20}")
                    else:
                        cells.append(f"{m['seconds']:>9.3f}s {m['peak']:>3} fds")
                print(
                    f"{r:>6} {a:>8} "
                    + " ".join(f"{c:>20}" for c in cells)
                    + f"  (made {made:.1f}s)"
                )
                want = {"status": info["error"], "supervisor": FailureClass.crash, "claim": "free"}
                for cmd in COMMANDS:
                    got = results[(r, a, cmd)]["answer"]
                    if str(got).startswith("FAILED") or want.get(cmd, got) != got:
                        print(f"       {cmd}: wrong answer: {got!r}")
    a = attempts[-1]
    print(f"growth, time at 4,096 ranks / time at 512 ranks ({a} attempts), wall and CPU:")
    for cmd in COMMANDS:
        big, small = results[(4096, a, cmd)], results[(512, a, cmd)]
        if big["seconds"] is None or small["seconds"] is None:
            print(f"  {cmd:>10}: n/a")
            continue
        wall = big["seconds"] / max(small["seconds"], 1e-6)
        cpu = big["cpu"] / max(small["cpu"], 1e-6)
        print(f"  {cmd:>10}: wall {wall:.2f}x, cpu {cpu:.2f}x ({big['cpu']:.3f}s cpu at 4,096)")


if __name__ == "__main__":
    main()
