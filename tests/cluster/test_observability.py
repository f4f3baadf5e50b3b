"""Observability on the real local cluster: stragglers are named, goodput adds up, the CLI shows it.

Both runs are submitted at once by one module fixture (2 nodes each on the 4-node cluster), so the
file takes about as long as its slowest run: the one the time limit interrupts (~2.5 min).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurmtrain.common.events import Finished, Requeued, Signal, Started, Straggler
from tests.cluster.helpers import cancel_all_of, events, only_run, wait_event
from tests.conftest import read_jsonl, run_cli

pytestmark = pytest.mark.slurm
BASE = ["cluster=slurm", "nodes=2", "faults.health_check=true"]
SLOW, LIMITED = "obs-straggler", "obs-timelimit"


def _submit(workdir: Path, name: str, args: list[str], inject: str) -> Path:
    done = run_cli(
        BASE + [f"name={name}", "faults.allow_inject=true"] + args,
        cwd=workdir,
        env={"SLURMTRAIN_INJECT": inject},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run(workdir / "runs", name)


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    """Submit both runs before either test waits on one."""
    workdir = tmp_path_factory.mktemp("observability")
    slow = _submit(
        workdir,
        SLOW,
        # Straggler detection needs DeepSpeed's timers (off by default).
        [
            "train.log_interval=5",
            "train.max_steps=30",
            "checkpoint.interval_steps=0",
            "train.timers=true",
        ],
        inject="slow_rank=1,slow_factor=4",
    )
    # Same recipe as test_time_limit_saves_requeues_and_finishes_with_no_step_lost: Slurm sends
    # USR2 60-90 s into the first attempt, 100 steps of ~1 s need a second one.
    limited = _submit(
        workdir,
        LIMITED,
        [
            "cluster.time=2",
            "cluster.signal_lead_s=30",
            "train.max_steps=100",
            "train.log_interval=1",
            "checkpoint.interval_steps=5",
        ],
        inject="step_delay=0.8",
    )
    yield {"workdir": workdir, SLOW: slow, LIMITED: limited}
    for name in (SLOW, LIMITED):
        cancel_all_of(name)


def test_slowed_rank_is_flagged_as_a_straggler_with_its_node(runs):
    run = runs[SLOW]
    wait_event(run, Finished, timeout=300)
    ev = events(run)
    [started] = [e for e in ev if isinstance(e, Started)]
    node1 = started.hosts[1]
    flagged = [e for e in ev if isinstance(e, Straggler)]
    assert flagged, "no straggler event for the slowed rank"
    assert all(e.rank == 1 for e in flagged), flagged  # rank 0 is never named
    assert all(e.node == node1 and e.factor > 1.5 for e in flagged), flagged
    rows = read_jsonl(run / "bad_nodes.jsonl")
    stragglers = [r for r in rows if r["reason"] == "straggler"]
    assert stragglers and {r["node"] for r in stragglers} == {node1}, rows


def test_interrupted_run_goodput_adds_up_and_the_cli_shows_it(runs):
    run, workdir = runs[LIMITED], runs["workdir"]
    wait_event(run, Finished, timeout=400)
    ev = events(run)
    assert any(isinstance(e, Signal) for e in ev) and any(isinstance(e, Requeued) for e in ev)

    from slurmtrain.cli.goodput import compute_goodput

    g = compute_goodput(run)
    assert g.attempts >= 2 and not g.live
    times = [e.time for e in ev]
    wall = max(times) - min(times)  # submitted -> finished, from the ledger alone
    assert abs(sum(g.parts().values()) - wall) <= 0.02 * wall, (g, wall)
    for part in ("queue_wait", "startup", "productive", "checkpoint_save"):
        assert getattr(g, part) > 0, (part, g)

    status = run_cli(["status", "--json", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout.splitlines()[0])
    assert row["goodput"] == pytest.approx(g.goodput, abs=0.01) and row["goodput"] > 0

    report = run_cli(["report", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert report.returncode == 0, report.stdout + report.stderr
    png = run / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_logs_tag_the_lines_of_both_attempts(runs):
    run, workdir = runs[LIMITED], runs["workdir"]
    wait_event(run, Finished, timeout=400)
    attempts = sum(isinstance(e, Started) for e in events(run))
    logs = run_cli(["logs", str(run)], cwd=workdir, module="slurmtrain.cli")
    assert logs.returncode == 0, logs.stderr
    tagged = {int(a) for a in re.findall(r"^\[a(\d+) r[\d?]+\]", logs.stdout, re.MULTILINE)}
    assert attempts >= 2 and tagged == set(range(1, attempts + 1)), (attempts, sorted(tagged))
    # Every training progress line says which attempt printed it (rank 0 logs them).
    progress = [ln for ln in logs.stdout.splitlines() if re.search(r"\] step \d+/100 ", ln)]
    assert progress and all(re.match(r"\[a\d+ r0\]", ln) for ln in progress), [
        ln for ln in progress if not re.match(r"\[a\d+ r0\]", ln)
    ][:3]
