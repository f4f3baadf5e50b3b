"""The node-local checkpoint tier (issue 38): a killed run resumes from its own local copy, then,
with that copy deleted, from the buddy node's copy, then, with the buddy copy corrupted too, from
the shared tier; each time the ledger names the tier and the losses stay bitwise the reference's.
Two "nodes" on one host: one rank each (SLURMTRAIN_LOCAL_RANKS_PER_NODE=1), each its own `{node}`
local directory, so deleting one node's directory is losing that node's storage.

A drill, not a CI test (five CLI runs: ~5 min on this 2-core machine); it prints each attempt's
killed step, loaded step and tiers, and the reference run's local saves' seconds (rank 0's log
line): with opt_tiny's ~2 MB a node they are the tier's fixed cost (collectives, manifest, seal,
renames, fsyncs), which it writes to bench/results/local_tier_fixed.txt for the planner and
tools/goodput_sim.py:

    python -m pytest -q -s bench/local_tier_drill.py
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's tests/ helpers

from slurmtrain.common.events import CheckpointLoaded, Finished, ResumeSource, Started
from tests.conftest import PYTHON, ledger_of, read_jsonl, run_cli, run_dirs, slurmtrain_env
from tests.local.test_local_runs import _wait_for_step, losses_by_step

EVERY = 2
FIXED_FILE = Path(__file__).resolve().parent / "results" / "local_tier_fixed.txt"
SAVED = re.compile(
    r"local checkpoint step_\d+ saved in ([0-9.]+) s: write ([0-9.]+) s[^,]*, buddy copy ([0-9.]+) s,"
    r".* ([0-9.]+) s; ([0-9.]+) MB a node"
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def local_tier_args(workdir: Path) -> list[str]:
    return [
        "train.max_steps=20",
        "train.log_interval=1",
        "faults.health_check=false",  # a storage probe on this loaded box is not the subject
        "checkpoint.interval_steps=8",  # the shared tier: steps 8 and 16 (and 20)
        f"checkpoint.local_every_steps={EVERY}",
        f"checkpoint.local_dir='{workdir}/local/node{{node}}'",
    ]


LOCAL_ENV = {"SLURMTRAIN_LOCAL_RANKS_PER_NODE": "1"}


def _kill_after(run: Path, args: list[str], workdir: Path, step: int, attempt: int) -> int:
    """Start (or resume) the run, SIGKILL its ranks once `step` is logged; the last step logged."""
    env = slurmtrain_env({**LOCAL_ENV, "SLURMTRAIN_INJECT": "step_delay=0.3"})
    proc = subprocess.Popen(
        [PYTHON, "-m", "slurmtrain", *args, "name=killed", "faults.allow_inject=true"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait_for_step(run / "metrics.jsonl", step, proc)
    started = [e for e in ledger_of(run, Started) if e.attempt == attempt]
    for pid in started[-1].pids:
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    return max(int(r["step"]) for r in read_jsonl(run / "metrics.jsonl"))


def resume_tiers(run: Path, attempt: int) -> dict[str, set[str]]:
    rows = [e for e in ledger_of(run, ResumeSource) if e.attempt == attempt]
    return {"tiers": {str(e.tier) for e in rows}, "reasons": {str(e.reason) for e in rows}}


def _loaded(run: Path, attempt: int) -> int:
    [row] = [e for e in ledger_of(run, CheckpointLoaded) if e.attempt == attempt]
    return int(row.step or 0)


def _fixed_cost(run: Path) -> str:
    """The reference run's local saves (rank 0's lines): the median of each part, in seconds."""
    saves = [
        tuple(float(x) for x in m.groups())
        for log in sorted((run / "logs").glob("*.err"))
        for m in SAVED.finditer(log.read_text(errors="replace"))
    ]
    assert saves, f"no local save line in {run / 'logs'}"
    total, write, copy, rest, mb = (statistics.median(col) for col in zip(*saves))
    return (
        f"# python -m pytest -q -s bench/local_tier_drill.py ({time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()}-core VM, 2 nodes x 1 CPU rank on one host, gloo on loopback)\n"
        f"# the median of {len(saves)} local saves of opt_tiny ({mb:.1f} MB a node: the bytes "
        f"are negligible, so the save's seconds are its fixed cost): write {write:.3f} s, "
        f"buddy copy {copy:.3f} s, the rest {rest:.3f} s\n"
        f"local_save_fixed s: {total:.3f}\n"
    )


def test_resume_from_own_then_buddy_then_shared_bitwise(workdir: Path) -> None:
    args = local_tier_args(workdir)
    reference = run_cli([*args, "name=reference"], cwd=workdir, env=LOCAL_ENV)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    [ref_run] = run_dirs(workdir / "runs")
    fixed = _fixed_cost(ref_run)
    print(fixed, end="")
    FIXED_FILE.write_text(fixed)
    losses = losses_by_step(ref_run)
    run = workdir / "runs" / "killed" / ref_run.name  # same config: same fingerprint
    local = [workdir / "local" / f"node{n}" for n in (0, 1)]

    # 1. own local copy: at most EVERY steps recomputed
    k1 = _kill_after(run, args, workdir, 11, attempt=1)  # local: step 10; shared: step 8
    k2 = _kill_after(run, args, workdir, k1 + 2, attempt=2)
    assert k1 - EVERY <= _loaded(run, 2) <= k1
    assert resume_tiers(run, 2)["tiers"] == {"local"}

    # 2. node 1 lost its storage: its ranks take the step from node 0's buddy copy
    for own in local[1].glob("*/own"):
        shutil.rmtree(own)
    k3 = _kill_after(run, args, workdir, k2 + 1, attempt=3)
    assert k2 - EVERY <= _loaded(run, 3) <= k2
    assert resume_tiers(run, 3)["tiers"] == {"local", "buddy"}

    # 3. and its buddy copies are corrupt: the shared tier, with the reason logged
    for own in local[1].glob("*/own"):
        shutil.rmtree(own)
    for held in local[0].glob("*/buddy/1/step_*"):
        for shard in held.glob("*optim_states.pt"):
            shard.write_bytes(b"\0" * shard.stat().st_size)
    resumed = run_cli([*args, "name=killed"], cwd=workdir, env=LOCAL_ENV)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _loaded(run, 4) in (8, 16) and _loaded(run, 4) <= k3
    tiers = resume_tiers(run, 4)
    assert tiers["tiers"] == {"shared"}
    assert any("checksum" in r for r in tiers["reasons"]), tiers
    assert isinstance(ledger_of(run, Finished)[-1], Finished)
    assert losses_by_step(run) == losses  # bitwise across all four attempts
    for n, killed in ((2, k1), (3, k2), (4, k3)):
        print(
            f"attempt {n}: killed at step {killed}, loaded step {_loaded(run, n)}: {resume_tiers(run, n)}"
        )
