"""`python -m slurmtrain.cli status` over one sweep's worth of run directories: how long it takes.

    .venv/bin/python bench/status_speed.py [--runs 501] [--repeat 5] [--root DIR] [--keep]

Writes `--runs` realistic run directories (the layout real runs write: config.yaml and
overrides.yaml as the login side writes them, a login `submitted` row, rank 0's run-tier file with
started/rendezvous/health/startup/checkpoint rows, the supervisor's rows and rank-tier `failed`
rows of a crashed point, metrics.jsonl rows every 10 steps with a validation loss every 50, the
`latest` checkpoint pointer) in four sweeps (lr_sweep, lr_warmup, wd_sweep, and a one-run
baseline), a mix of finished, running, pending, crashed/stopped, diverged and new points. Slurm
runs' liveness is answered by a fake `squeue`/`sacct` put first on PATH that counts its calls
(status must ask Slurm once for all runs, never once per run).

Then times, in fresh processes, warm (one untimed run first), median of `--repeat`:
  status over an empty root (imports and start-up), status over all runs, `status --json`,
  status over all runs without its cache of finished runs' figures (cli/status_cache.py; the
  first status after a sweep finishes pays this once), `status ROOT/lr_sweep --state finished`,
  and status over one run whose ledger holds each bad input of #37 (a row without `event`, a
  line that is no JSON object, a directory named `*.jsonl`, a 64 MiB `failed` row: make_bad),
  with the one warning line it prints; and prints the Slurm calls each made and the load.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, TypeVar

import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurmtrain.common import events  # noqa: E402
from slurmtrain.common.events import FailureClass  # noqa: E402

R = TypeVar("R", bound=events.Row)
SWEEPS = (("lr_sweep", 200), ("lr_warmup", 150), ("wd_sweep", 150), ("baseline", 1))
JOB_BASE = 7000
NODE = "gpu-a017"
MAX_STEPS = 1000

FAKE_SLURM = r"""#!/bin/sh
# fake squeue/sacct for bench/status_speed.py: the jobs in $FAKE_SLURM_STATES (id|state|reason)
# are those Slurm still holds; sacct knows nothing (no accounting)
echo "$(basename "$0") $*" >> "$FAKE_SLURM_LOG"
[ "$(basename "$0")" = sacct ] && exit 0
ids=""; fmt="%T"
while [ $# -gt 0 ]; do
  case "$1" in -j) ids="$2"; shift ;; -o) fmt="$2"; shift ;; esac
  shift
done
exec awk -F'|' -v ids="$ids" -v fmt="$fmt" '
  BEGIN { n = split(ids, a, ","); for (i = 1; i <= n; i++) want[a[i]] = 1 }
  ids == "" || ($1 in want) {
    out = fmt; gsub("%i", $1, out); gsub("%T", $2, out); gsub("%r", $3, out); print out
  }' "$FAKE_SLURM_STATES"
"""


def _config_template() -> dict[str, object]:
    """The resolved default config (cluster=slurm), as config.yaml holds it."""
    sys.path.insert(0, str(REPO))
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema
    from slurmtrain.login.prepare import resolve

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm"])
    data: dict[str, object] = schema.plain(resolve(cfg))
    return data


def _dump(path: Path, rows: Sequence[events.Row | Mapping[str, object]]) -> None:
    """Append rows to a JSON-lines file: ledger rows as the ledger holds them, metrics as dicts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row.to_json() if isinstance(row, events.Row) else row) + "\n")


def make_runs(root: Path, n: int = 501, seed: int = 0) -> dict[str, str]:
    """`n` run directories under `root` (spread over SWEEPS); returns {job id: squeue state} of
    the jobs Slurm still holds (what the fake squeue answers)."""
    rnd = random.Random(seed)
    template = _config_template()
    dumper = getattr(yaml, "CDumper", yaml.Dumper)
    queued: dict[str, str] = {}
    sizes = [size for _, size in SWEEPS]
    scale = n / sum(sizes)
    plan = [(name, max(1, round(size * scale))) for name, size in SWEEPS]
    plan[0] = (plan[0][0], plan[0][1] + n - sum(s for _, s in plan))
    i = 0
    now = time.time()
    for sweep, size in plan:
        array = JOB_BASE + i
        t0 = now - 6 * 3600 + rnd.uniform(0, 3600)
        for point in range(size):
            lr = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2][point % 5]
            wd = [0.0, 0.01, 0.1][(point // 5) % 3]
            overrides = [f"name={sweep}", f"optim.lr={lr}", f"optim.weight_decay={wd}"]
            overrides.append(f"data.seed={1000 + point}")
            cfg = json.loads(json.dumps(template))
            cfg.update(name=sweep, runs_root=str(root))
            cfg["optim"].update(lr=lr, weight_decay=wd)
            cfg["data"]["seed"] = 1000 + point
            cfg["train"]["max_steps"] = MAX_STEPS  # what _fill trains to
            fp = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]
            run = root / sweep / fp
            for sub in ("checkpoints", "logs", "provenance", "ledger.d"):
                (run / sub).mkdir(parents=True, exist_ok=True)
            (run / "config.yaml").write_text(yaml.dump(cfg, Dumper=dumper, sort_keys=False))
            (run / "overrides.yaml").write_text(yaml.safe_dump(overrides))
            (run / "job.sbatch").write_text(f"#!/bin/bash\n#SBATCH --job-name={sweep}\n")
            job = f"{array}_{point}"
            kind = _kind(rnd, sweep, point)
            _fill(run, kind, job, t0 + point * 2.0, lr, rnd, queued)
            i += 1
    return queued


DONE, DIVERGING = "done", "nan_loss"  # synthetic runs' kinds (with new, pending, ...)


def _kind(rnd: random.Random, sweep: str, point: int) -> str:
    if sweep == "baseline":
        return DONE
    r = rnd.random()
    for kind, p in (("new", 0.02), ("pending", 0.08), ("running", 0.2), ("crashed", 0.3)):
        if r < p:
            return kind
    return DIVERGING if r < 0.34 else DONE


def _fill(
    run: Path, kind: str, job: str, t: float, lr: float, rnd: random.Random, q: dict[str, str]
) -> None:
    if kind == "new":  # written, never submitted: its directory's mtime orders it
        os.utime(run, (t, t))
        return
    led = run / "ledger.d"
    token = rnd.getrandbits(24)
    _dump(
        led / f"login1.{rnd.randint(1000, 99999)}.{token:06x}.jsonl",
        [
            events.Submitted(
                time=t, job_id=job, nodes=(NODE,), executor="slurm", fingerprint=run.name
            )
        ],
    )
    if kind == "pending":
        q[job] = "PENDING"
        return
    t += rnd.uniform(30, 600)
    max_steps = MAX_STEPS
    steps = {"running": rnd.randint(20, 990), "crashed": rnd.randint(20, 990)}.get(kind, max_steps)
    if kind == DIVERGING:
        steps = rnd.randint(120, 990)
    rank0 = led / f"{NODE}.{rnd.randint(1000, 99999)}.{rnd.getrandbits(24):06x}.jsonl"
    rows = _started(t, job)
    _dump(run / "metrics.jsonl", _metrics(run, job, t, lr, steps, rnd, rows))
    end = t + 20 + steps * 1.5
    if kind == "running":
        q[job] = "RUNNING"
    elif kind == DONE:
        rows.append(_at(job, events.Finished(time=end, step=steps, rank=0, node=NODE)))
    else:
        _stop(led, kind, job, end, steps, rnd, rows)
    _dump(rank0, rows)


def _at(job: str, row: R) -> R:
    """`row` placed where a synthetic run's rank-0 and supervisor rows are: attempt 1 of `job`."""
    return dataclasses.replace(row, job_id=job, attempt=1, nodes=(NODE,))


def _started(t: float, job: str) -> list[events.Row]:
    """Rank 0's first rows: the start, the rendezvous, the health gate, the start-up phases."""
    return [
        _at(job, events.Started(time=t, world_size=8, hosts=(NODE,) * 8, restart=0, relaunch=0)),
        _at(job, events.RendezvousDone(time=t + 2, seconds=2.1, rank=0, node=NODE)),
        _at(job, events.HealthOk(time=t + 3, seconds=0.6, allreduce_gbps=180.0, rank=0, node=NODE)),
        _at(
            job,
            events.Startup(time=t + 20, seconds=18.9, phases={"imports": 5.0}, rank=0, node=NODE),
        ),
    ]


def _metrics(
    run: Path, job: str, t: float, lr: float, steps: int, rnd: random.Random, rows: list[events.Row]
) -> list[dict[str, object]]:
    """metrics.jsonl's rows (plain dicts) up to `steps`; a `checkpoint_saved` row (and `latest`)
    every 250 steps."""
    metrics: list[dict[str, object]] = []
    loss = 10.0
    for step in range(10, steps + 1, 10):
        st = t + 20 + step * 1.5
        loss = 2.0 + (loss - 2.0) * (0.995 - lr) + rnd.uniform(-0.02, 0.02)
        m: dict[str, object] = {"step": step, "time": st, "attempt": 1, "loss": loss}
        m.update(lr=lr, consumed_samples=step * 64, tokens_per_s=2.1e5, step_time=0.31)
        if step % 50 == 0:
            m["valid_loss"] = loss + 0.05
            m["valid_ppl"] = 2.718**loss
        metrics.append(m)
        if step % 250 == 0:
            rows.append(_at(job, events.CheckpointSaved(time=st, step=step, seconds=0.4, rank=0)))
            (run / "checkpoints" / "latest").write_text(f"step_{step}\n")
    return metrics


def _stop(
    led: Path,
    kind: str,
    job: str,
    end: float,
    steps: int,
    rnd: random.Random,
    rows: list[events.Row],
) -> None:
    """A crashed or diverged run: its rank's `failed` row, the supervisor's end and stop."""
    cls, err = (
        FailureClass.crash,
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    )
    if kind == DIVERGING:
        cls, err = FailureClass.diverged, f"loss nan at step {steps}: rollback budget (3) spent"
        rows += [_at(job, events.Rollback(time=end - 5, step=steps, to_step=steps - 25))]
    tb = "Traceback (most recent call last):\n  ...\n" + err
    failed = events.Failed(
        time=end, job_id=job, nodes=(NODE,), node=NODE, step=steps, error=tb, restart=0, cls=cls
    )
    _dump(led / "ranks" / f"{job}.0.0" / f"{NODE}.jsonl", [failed])
    sup = led / f"{NODE}.{rnd.randint(1000, 99999)}.{rnd.getrandbits(24):06x}.jsonl"
    _dump(
        sup,
        [
            _at(job, events.AttemptEnded(time=end + 1, exit_code=1, step=steps, cls=cls)),
            _at(job, events.Stopped(time=end + 2, step=steps, error=err, cls=cls)),
        ],
    )


def make_bad(root: Path, big: int = 64 << 20) -> Path:
    """One finished run whose ledger holds each bad input of #37 Why 5: a row without `event`, a
    line that is not a JSON object, one that is not JSON, a directory named `*.jsonl`, and a
    rank's `failed` row with a `big`-byte error (what an uncapped writer once wrote)."""
    run = root / "bad" / "0123456789ab"
    (run / "logs").mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("name: bad\ntrain:\n  max_steps: 20\n")
    (run / "logs" / "51_0.out").write_text("step 20 loss 2.5\n")
    rows: list[events.Row] = [
        events.Submitted(time=1.0, job_id="51", executor="local"),
        _at("51", events.Started(time=2.0)),
        _at("51", events.Finished(time=9.0, step=20)),
    ]
    led = run / "ledger.d"
    _dump(led / "login.1.abc.jsonl", rows)
    with open(led / "login.1.abc.jsonl", "a") as f:
        f.write('{"time": 5.0}\n[1, 2]\n{"event": "fini\\u0000 garbage\n')
    (led / "odd.jsonl").mkdir(exist_ok=True)
    (led / "ranks" / "51.0.0").mkdir(parents=True, exist_ok=True)
    with open(led / "ranks" / "51.0.0" / f"{NODE}.jsonl", "w") as f:
        f.write('\n{"event": "failed", "time": 8.0, "class": "crash", "error": "')
        for _ in range(big >> 20):
            f.write("x" * (1 << 20))
        f.write('"}\n')
    _dump(run / "metrics.jsonl", [{"step": 20, "time": 8.0, "valid_loss": 2.5}])
    return root / "bad"


def _fake_slurm(where: Path, queued: dict[str, str]) -> dict[str, str]:
    bindir = where / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("squeue", "sacct"):
        (bindir / name).write_text(FAKE_SLURM)
        (bindir / name).chmod(0o755)
    states = where / "states.txt"
    states.write_text("".join(f"{job}|{state}|None\n" for job, state in queued.items()))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    env.update(FAKE_SLURM_STATES=str(states), FAKE_SLURM_LOG=str(where / "calls.log"))
    env["SLURMTRAIN_SLURM_RETRY_S"] = "0"
    env["SLURMTRAIN_STATUS_CACHE"] = str(where / "status-cache.json")  # not the user's own
    env["COLUMNS"] = "200"
    return env


def _time(
    args: list[str], env: dict[str, str], repeat: int, log: Path, script: Optional[Path]
) -> tuple[float, float, int]:
    """(median wall seconds of `repeat` runs after one warm-up, their median CPU seconds (user +
    system: what a loaded machine does not inflate much), Slurm calls of one run)."""
    status = [str(script)] if script else ["-m", "slurmtrain.cli", "status"]
    cmd = [sys.executable, *status, *args]
    warm = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)  # warm caches
    if warm.returncode != 0:
        raise RuntimeError((warm.stderr.strip().splitlines() or ["?"])[-1])
    for line in warm.stderr.splitlines():  # what it skipped (the bad ledger's one line)
        print(f"  {line}")
    log.write_text("")
    times, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    calls = len(log.read_text().splitlines()) // repeat
    return statistics.median(times), statistics.median(cpu), calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=501)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--root", type=Path, help="where to write the runs (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated runs")
    parser.add_argument(
        "--script",
        type=Path,
        help="time this copy of cli/status.py instead (an earlier version: "
        "git show REV:slurmtrain/cli/status.py > /tmp/status_old.py)",
    )
    args = parser.parse_args()
    work = args.root or Path(tempfile.mkdtemp(prefix="status_speed."))
    root, empty = work / "runs", work / "empty"
    t = time.perf_counter()
    if args.root is not None and (work / "queued.json").is_file() and root.is_dir():
        queued = json.loads((work / "queued.json").read_text())  # made by an earlier --root run
    else:
        shutil.rmtree(root, ignore_errors=True)
        queued = make_runs(root, args.runs)
        (work / "queued.json").write_text(json.dumps(queued))
    empty.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "badroot", ignore_errors=True)  # its files are appended to
    bad = make_bad(work / "badroot")
    made = time.perf_counter() - t
    env = _fake_slurm(work, queued)
    log = work / "calls.log"
    print(f"{args.runs} runs under {root} ({made:.1f} s to make; {len(queued)} jobs queued)")
    cases = [
        ("empty root", [str(empty)]),
        (f"{args.runs} runs", [str(root)]),
        (f"{args.runs} runs --json", ["--json", str(root)]),
        (f"{args.runs} runs, no cache", [str(root)]),
        ("one sweep --state finished", [str(root / "lr_sweep"), "--state", "finished"]),
        ("bad ledger, a 64 MiB line", [str(bad)]),
    ]
    for label, argv in cases:
        load = os.getloadavg()[0]
        # "no cache": every finished run's metrics read and its goodput computed, every time
        off = dict(env, SLURMTRAIN_STATUS_CACHE="off") if "no cache" in label else env
        try:
            median, cpu, calls = _time(argv, off, args.repeat, log, args.script)
        except RuntimeError as err:
            print(f"status {label:<28} fails: {err}")
            continue
        print(
            f"status {label:<28} {median:6.3f} s  (CPU {cpu:.3f} s; median of {args.repeat}, "
            f"warm; {calls} Slurm call(s); load {load:.2f})"
        )
    if not args.keep and args.root is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
