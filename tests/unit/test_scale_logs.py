"""`logs` at scale: 4,096 ranks (512 nodes x 8) x 100 attempts under `ulimit -n 256`.

10 job ids x 10 requeues each: a requeued job keeps its id, so srun (`--open-mode=append`) appends
every requeue of a job to the same `logs/<job>_<rank>.out|err`; the ledger (run-tier rows only)
says when each attempt started and ended. The reader must hold O(1) files open whatever the count.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

NODES, GPUS, JOBS, REQUEUES = 512, 8, 10, 10
T0 = datetime(2024, 5, 1, 10, 0, 0).timestamp()  # naive log stamps are local time: so is this
SPACING = 1000.0  # seconds between attempt starts; each attempt logs for ~60 s of it

# attempt -> (rank whose real traceback comes first, a later real one, ranks with earlier NCCL echoes)
FAILURES = {95: (42, 4000, range(0, 4096, 97)), 100: (3001, 17, range(5, 4096, 64))}


def attempt_job(n: int) -> tuple[str, int]:
    """Attempt n (1-based) -> its job id and Slurm's restart count."""
    return str(7000 + (n - 1) // REQUEUES), (n - 1) % REQUEUES


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def _tb(r: int, n: int) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/app/slurmtrain/train/data.py", line 40, in load_tokens\n'
        f'    raise ValueError("rank {r} attempt {n}: shard missing")\n'
        f"ValueError: rank {r} attempt {n}: shard missing\n"
    )


def _nccl_tb(r: int) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/venv/torch/distributed/distributed_c10d.py", line 2050, in all_reduce\n'
        "    work = group.allreduce([tensor], opts)\n"
        f"torch.distributed.DistBackendError: [Rank {r}] ProcessGroupNCCL watchdog timeout\n"
    )


def attempt_text(n: int, r: int) -> str:
    """Rank r's stderr lines of attempt n: a start, a step, and the failure if it has one."""
    t = T0 + (n - 1) * SPACING
    text = f"{_stamp(t + 1)} INFO rank {r} start attempt {n}\n{_stamp(t + 10)} INFO step 100\n"
    if n in FAILURES:
        first, later, echoes = FAILURES[n]
        if r == first:
            text += f"{_stamp(t + 20)} ERROR rank {r} loading data\n" + _tb(r, n)
        elif r == later:
            text += f"{_stamp(t + 25)} ERROR rank {r} loading data\n" + _tb(r, n)
        elif r in echoes:
            text += f"{_stamp(t + 15)} ERROR collective failed\n" + _nccl_tb(r)
    return text


def make_scale_run(run: Path, nodes: int = NODES, gpus: int = GPUS) -> Path:
    """JOBS x REQUEUES attempts of nodes x gpus ranks: logs appended per job, run-tier ledger rows."""
    logs, ledger = run / "logs", run / "ledger.d"
    logs.mkdir(parents=True)
    ledger.mkdir()
    ranks, rows = range(nodes * gpus), []
    for n in range(1, JOBS * REQUEUES + 1):
        job, restart = attempt_job(n)
        t = T0 + (n - 1) * SPACING
        hosts = [f"gpu{i:04d}" for i in range(nodes)]
        base = {"job_id": job, "attempt": n, "nodes": hosts, "restart": restart}
        if restart == 0:
            rows.append({"event": "submitted", "time": t - 30, **base, "attempt": None})
        rows.append({"event": "started", "time": t, **base})
        rows.append({"event": "attempt_ended", "time": t + 60, **base, "rc": 1})
    (ledger / "x.1.abc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for j in range(JOBS):
        attempts = range(j * REQUEUES + 1, (j + 1) * REQUEUES + 1)
        job = attempt_job(attempts[0])[0]
        batch = "".join(
            f"{_stamp(T0 + (n - 1) * SPACING)} slurmtrain: attempt {n}\n" for n in attempts
        )
        (logs / f"{job}.batch.out").write_text(batch)
        for r in ranks:
            for stream, data in (
                ("err", "".join(attempt_text(n, r) for n in attempts)),
                ("out", "".join(f"step line a{n}\n" for n in attempts) if r == 0 else ""),
            ):
                fd = os.open(logs / f"{job}_{r}.{stream}", flags, 0o644)
                os.write(fd, data.encode())
                os.close(fd)
    return run


def run_logs(run: Path, *args: str, nofile: int = 256) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "slurmtrain.cli.logs", str(run), *args],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    return make_scale_run(tmp_path_factory.mktemp("scale") / "run")


def _first_error(out: str) -> str:
    assert "First error" in out, out[-2000:]
    return out[out.index("First error") :]


def _tags(out: str) -> set[tuple[int, str]]:
    return {(int(a), r) for a, r in re.findall(r"^\[a(\d+) r([\d?]+)\]", out, re.MULTILINE)}


def test_default_shows_the_newest_attempt_and_its_first_error(big_run: Path) -> None:
    p = run_logs(big_run)
    assert p.returncode == 0, p.stderr[-3000:]
    tags = _tags(p.stdout)
    assert {a for a, _ in tags} == {100}
    assert {r for _, r in tags} == {str(r) for r in range(NODES * GPUS)} | {"?"}
    first = _first_error(p.stdout)
    assert "[a100 r3001]" in first and "ValueError: rank 3001 attempt 100" in first, first
    assert "NCCL" not in first
    # One line says how to see the rest.
    assert "--attempt" in p.stdout and "--all" in p.stdout


def test_an_older_attempt_inside_appended_files(big_run: Path) -> None:
    p = run_logs(big_run, "--attempt", "95")
    assert p.returncode == 0, p.stderr[-3000:]
    assert {a for a, _ in _tags(p.stdout)} == {95}
    assert "[a95 r7] " in p.stdout and "start attempt 95" in p.stdout
    first = _first_error(p.stdout)
    assert "[a95 r42]" in first and "ValueError: rank 42 attempt 95" in first, first


def test_one_rank_across_every_attempt(big_run: Path) -> None:
    p = run_logs(big_run, "--rank", "42")
    assert p.returncode == 0, p.stderr[-3000:]
    assert _tags(p.stdout) == {(n, "42") for n in range(1, JOBS * REQUEUES + 1)}
    assert "[a95 r42]" in _first_error(p.stdout)


def test_one_rank_of_one_attempt(big_run: Path) -> None:
    p = run_logs(big_run, "--rank", "17", "--attempt", "100", "--errors")
    assert p.returncode == 0, p.stderr[-3000:]
    assert _tags(p.stdout) == {(100, "17")}
    assert "ValueError: rank 17 attempt 100" in _first_error(p.stdout)


def test_every_attempt_of_512_ranks_in_attempt_order(tmp_path: Path) -> None:
    """`--all` reads every file, still one at a time, merged a job (10 attempts) at a time."""
    run = make_scale_run(tmp_path / "run", nodes=64, gpus=8)
    p = run_logs(run, "--all", "--errors")
    assert p.returncode == 0, p.stderr[-3000:]
    attempts = [int(a) for a in re.findall(r"^\[a(\d+) r", p.stdout, re.MULTILINE)]
    assert attempts == sorted(attempts) and set(attempts) == {95, 100}
    first = _first_error(p.stdout)
    assert "[a95 r42]" in first and "ValueError: rank 42 attempt 95" in first, first
    assert "Showing attempt" not in p.stdout
