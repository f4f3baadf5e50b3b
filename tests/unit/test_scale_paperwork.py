"""The scale drill: the paperwork of 4,096 ranks (512 nodes x 8) x 100
attempts, the last an all-rank failure, read under `ulimit -n 256` by `status --json`, the
supervisor's classification and rank 0's claim: all answer, and correctly. Files are made the
way the writers lay them out (bench/scale_paperwork.py make_paperwork); the readers run in child
processes with RLIMIT_NOFILE=256, so a reader that opens a file per rank dies with EMFILE."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "scale_paperwork", ROOT / "bench" / "scale_paperwork.py"
)
sp = importlib.util.module_from_spec(spec)
sys.modules["scale_paperwork"] = sp
spec.loader.exec_module(sp)

RANKS, ATTEMPTS, NOFILE = 4096, 100, 256

DECIDE = r"""
import json, sys
from pathlib import Path
from slurmtrain.batch import supervise
from slurmtrain.common import events
from slurmtrain.common.rundir import RunDir
from slurmtrain.compute.faults import owner
run, job = RunDir(Path(sys.argv[1])), sys.argv[2]
view = supervise.attempt_view(run, job, 0, 0)
verdict = supervise.verdict_of(run, job, 0, 0, 1, [], 0.0)
claim, own = owner.check(run, {job})
print(json.dumps({
    "attempt": view.attempt,
    "failed": sum(isinstance(e, events.Failed) for e in view.rows),
    "class": verdict.cls,
    "claim": claim,
    "owner": own.job_id,
}))
"""


def _limited() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))


def _run(args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_limited,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _drill(info: dict) -> None:
    [line] = _run(["-m", "slurmtrain.cli", "status", "--json", info["run"]]).splitlines()
    row = json.loads(line)
    assert row["state"] == "stopped: crash"
    assert row["attempts"] == ATTEMPTS
    assert row["step"] == info["step"] and row["valid_loss"] == info["valid_loss"]
    assert row["class"] == "crash" and row["error"] == info["error"]
    assert row["job_id"] == info["job_id"]
    got = json.loads(_run(["-c", DECIDE, info["run"], info["job_id"]]))
    # the supervisor sees the last attempt's every rank, and the one real error decides
    assert got["attempt"] == ATTEMPTS and got["failed"] == RANKS
    assert got["class"] == "crash"
    assert got["claim"] == "free" and got["owner"] == info["job_id"]


@pytest.fixture(scope="module")
def paperwork(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return sp.make_paperwork(tmp_path_factory.mktemp("tiered"), RANKS, ATTEMPTS, "tiered")


def test_status_supervisor_and_claim_answer_at_4096_ranks_x_100_attempts_under_256_fds(
    paperwork: dict,
) -> None:
    ledger = Path(paperwork["run"]) / "ledger.d"
    # one file per node of the failed start, never one per rank
    assert len(list((ledger / "ranks" / f"{paperwork['job_id']}.0.0").iterdir())) == RANKS // 8
    _drill(paperwork)


def test_the_same_paperwork_in_the_old_per_rank_files_still_reads(tmp_path: Path) -> None:
    """A run directory written before the rank tier: every failing rank's own file (4,096 of
    them in ledger.d/) is a run-tier file, read one open file at a time."""
    info = sp.make_paperwork(tmp_path, RANKS, ATTEMPTS, "flat", logs=False)
    assert len(list((Path(info["run"]) / "ledger.d").glob("*.jsonl"))) > RANKS
    _drill(info)
