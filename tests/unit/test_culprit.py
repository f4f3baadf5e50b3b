"""The verdict on a failed attempt (batch/culprit.py): culprit rank and node, or none for a
configuration/user error, with evidence and confidence; recorded right after `attempt_ended`,
shown by `status` and `logs`, and acted on by exclusion only when sure and a node's fault.

Rows are written into a real run directory as the ranks and the supervisor write them and read
back through the supervisor's own reader (attempt_view); no Slurm is asked (no unexplained
failure is judged: that one polls Slurm, and its node comes from Slurm, given here as a verdict).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional

from slurmtrain.batch import culprit, exclusions, supervise
from slurmtrain.batch.verdict import Verdict, attempt_view, judge
from slurmtrain.cli import logs
from slurmtrain.cli.status_table import notes
from slurmtrain.common import errors, events
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir
from slurmtrain.planning import deadlines

HOSTS = ("n1", "n2")
WHERE: events.Where = {"job_id": "7", "attempt": 1, "nodes": list(HOSTS), "restart": 0}
PEER = "RuntimeError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
HANG = "no progress for 15 s after step 8 (phase step, deadline 15 g s)"


def _run(tmp_path: Path, started: bool = True) -> RunDir:
    run = RunDir(tmp_path)
    if started:
        run.record(events.Started(world_size=2, hosts=HOSTS, relaunch=0), **WHERE)
    return run


def _rank(run: RunDir, rank: int, row: events.Row, attempt: Optional[int] = 1, **more) -> None:
    node = HOSTS[rank]
    run.record_rank(
        row, job_id="7", restart=0, relaunch=0, on_node=node, attempt=attempt, rank=rank, **more
    )


def _stacks(run: RunDir, rank: int, main: str) -> None:
    """A watchdog's block in its node's hang dump: the main thread's stack ends in `main`."""
    path = run.hang_dump(1, HOSTS[rank])
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        f"==== rank {rank} ====\n{HANG}\n\nThread 1 (MainThread):\n"
        f'  File "/x/slurmtrain/compute/trainer.py", line 322, in on_step\n{main}\n'
        f'Thread 2 (slurmtrain-watchdog):\n  File "/x/watchdog.py", line 175, in _watch\n'
    )
    with open(path, "a") as f:
        f.write(text)


def _judged(run: RunDir, rc: int, verdict: Optional[Verdict] = None) -> events.AttemptVerdict:
    view = attempt_view(run, "7", 0, 0)
    return culprit.blame(run, view, verdict or judge(view, rc, list(HOSTS), 0.0))


def test_a_crash_on_one_rank_names_that_rank_and_node_but_a_crash_is_no_node_class(tmp_path):
    run = _run(tmp_path)
    _rank(run, 1, events.Failed(cls=FailureClass.crash, error="ValueError: bad shard 17"))
    _rank(run, 0, events.Failed(cls=FailureClass.crash, error=PEER))
    v = _judged(run, 1)
    assert (v.cls, v.culprit_rank, v.culprit_node, v.confidence) == ("crash", 1, "n2", "medium")
    assert v.evidence[0] == "first error: rank 1 (n2): ValueError: bad shard 17"
    run.record(v, **WHERE)
    assert exclusions.from_verdicts(run.run_events(), []) == []  # never excluded for a crash


def test_the_same_error_on_every_rank_blames_no_node(tmp_path):
    run = _run(tmp_path)
    for rank in (0, 1):
        failed = events.Failed(cls=FailureClass.crash, error=f"KeyError: 'tokens' (rank {rank})")
        _rank(run, rank, failed)
    v = _judged(run, 1)
    assert v.culprit_node is None and v.culprit_rank is None
    assert (v.no_culprit, v.confidence) == (culprit.USER, "high")


def test_a_configuration_error_never_blames_a_node_even_when_one_rank_reported_it(tmp_path):
    run = _run(tmp_path)
    _rank(run, 1, events.Failed(cls=FailureClass.crash, error="ConfigError: data.path missing"))
    v = _judged(run, errors.EXIT_CONFIG)
    assert v.cls == FailureClass.config_error and v.culprit_node is None
    assert v.no_culprit == culprit.USER and v.evidence[0].endswith("data.path missing")
    oom = events.Failed(cls=FailureClass.crash, error="torch.OutOfMemoryError: CUDA out of memory")
    _rank(run, 0, oom)
    v = _judged(run, 1)
    assert v.cls == FailureClass.oom and v.culprit_node is None and v.no_culprit == culprit.USER


def test_a_hang_names_the_rank_stuck_outside_a_collective_and_exclusion_takes_its_node(tmp_path):
    run = _run(tmp_path)
    for rank in (0, 1):
        _rank(run, rank, events.Failed(cls=FailureClass.hang, error=HANG, phase="step"))
    _stacks(run, 0, '  File "/x/deepspeed/comm/torch.py", line 1, in all_reduce')
    _stacks(run, 1, '  File "/x/slurmtrain/compute/faults/inject.py", line 98, in after_step')
    v = _judged(run, errors.EXIT_HANG)
    assert (v.cls, v.culprit_rank, v.culprit_node, v.confidence) == ("hang", 1, "n2", "high")
    assert any("outside any collective: ranks 1; ranks 0 wait in one" in e for e in v.evidence)
    run.record(v, **WHERE)
    [row] = exclusions.from_verdicts(run.run_events(), [])
    assert row["node"] == "n2" and str(row["reason"]).startswith("verdict: hang")
    # the bad-node ledger naming the node for that attempt already: the job counts once
    assert exclusions.from_verdicts(run.run_events(), [{"node": "n2", "attempt": 1}]) == []


def test_a_peers_failure_dump_counts_as_waiting_in_a_collective(tmp_path):
    """The hung rank exits first; its peer's collective fails and it dumps its stacks, headed by
    the traceback of that collective (watchdog.dump_after_peer_failure)."""
    run = _run(tmp_path)
    _rank(run, 1, events.Failed(cls=FailureClass.hang, error=HANG, phase="step"))
    _rank(run, 0, events.Failed(cls=FailureClass.crash, error=PEER))
    path = run.hang_dump(1, "n1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"==== rank 0 ====\npeer failure: {PEER}\nTraceback (most recent call last):\n"
        '  File "/x/torch/distributed/distributed_c10d.py", line 4287, in all_gather\n'
        "    work.wait()\n\nThread 1 (MainThread):\n"
        '  File "/x/slurmtrain/compute/attempt.py", line 362, in _train\n'
    )
    _stacks(run, 1, '  File "/x/slurmtrain/compute/faults/inject.py", line 98, in after_step')
    v = _judged(run, errors.EXIT_HANG)
    assert (v.culprit_rank, v.culprit_node, v.confidence) == (1, "n2", "high")


def test_a_hang_with_a_rank_that_reported_nothing_names_it_with_medium_confidence(tmp_path):
    run = _run(tmp_path)
    _rank(run, 0, events.Failed(cls=FailureClass.hang, error=HANG, phase="step"))
    _stacks(run, 0, '  File "/x/torch/distributed/distributed_c10d.py", line 1, in all_reduce')
    v = _judged(run, errors.EXIT_HANG)
    assert (v.culprit_rank, v.culprit_node, v.confidence) == (1, "n2", "medium")
    assert "missing heartbeats: ranks 1 reported nothing" in v.evidence
    run.record(v, **WHERE)
    assert exclusions.from_verdicts(run.run_events(), []) == []  # not sure enough to exclude


def test_every_rank_stuck_outside_a_collective_is_a_shared_cause(tmp_path):
    run = _run(tmp_path)
    for rank in (0, 1):
        _rank(run, rank, events.Failed(cls=FailureClass.hang, error=HANG, phase="save"))
        _stacks(run, rank, '  File "/x/checkpoint_format.py", line 9, in fsync')
    v = _judged(run, errors.EXIT_HANG)
    assert v.culprit_node is None and v.confidence == "low"


def test_a_node_failure_names_the_device_error_node_the_health_gate_or_slurm(tmp_path):
    run = _run(tmp_path)
    xid = "RuntimeError: CUDA error: uncorrectable ECC error encountered; NVRM: Xid (PCI:0000:3b:00): 48, pid=1"
    _rank(run, 1, events.Failed(cls=FailureClass.crash, error=xid))
    _rank(run, 0, events.Failed(cls=FailureClass.crash, error=PEER))
    v = _judged(run, 1)
    assert (v.cls, v.culprit_rank, v.culprit_node, v.confidence) == (
        "node_failure",
        1,
        "n2",
        "high",
    )
    assert "xid 48 at 0000:3b:00" in v.evidence
    gate = _run(tmp_path / "gate")
    gate.record(events.BadNode(node="n1", reason="ecc: GPU 0 has 2 uncorrectable errors"), **WHERE)
    v = _judged(gate, errors.EXIT_BAD_NODE)
    assert (v.culprit_node, v.culprit_rank, v.confidence) == ("n1", 0, "high")
    down = _run(tmp_path / "down")  # nobody raised; Slurm marked n2 down (judge's poll)
    _rank(down, 0, events.Failed(cls=FailureClass.crash, error=PEER))
    v = _judged(down, 1, Verdict(FailureClass.node_failure, ["n2"]))
    assert (v.culprit_node, v.culprit_rank, v.confidence) == ("n2", 1, "high")
    assert "n2: marked down by Slurm" in v.evidence


def test_a_chronic_straggler_replaced_at_once_is_the_node_failures_culprit(tmp_path):
    """Rank 0 stopped the attempt (every rank exits EXIT_BAD_NODE, nobody failed) so a spare
    takes the chronic straggler's place: the straggler row is the evidence."""
    run = _run(tmp_path)
    slow = events.Straggler(rank=1, node="n2", factor=1.48, step=60, windows=5, chronic=True)
    run.record(dataclasses.replace(slow, excluded=True), **WHERE)
    v = _judged(run, errors.EXIT_BAD_NODE)
    assert (v.cls, v.culprit_node, v.culprit_rank, v.confidence) == (
        "node_failure",
        "n2",
        1,
        "high",
    )
    assert v.evidence == ("chronic straggler: n2 at 1.48x the median rank for 5 windows",)


def test_a_node_that_never_joined_the_rendezvous_is_the_culprit(tmp_path):
    run = _run(tmp_path, started=False)
    waited = events.Failed(
        cls=FailureClass.hang,
        error="no progress (waiting for ranks to join)",
        phase=deadlines.RENDEZVOUS,
        host="n1",
        step_nodes=HOSTS,
        arrived_at=time.time() - 30,
    )
    _rank(run, 0, waited, attempt=None, node=None)  # a waiting rank blames nobody itself
    v = _judged(run, errors.EXIT_HANG)
    assert (v.cls, v.culprit_node, v.confidence) == ("hang", "n2", "high")
    assert v.attempt is None and "never joined" in " ".join(v.evidence)


def test_the_supervisor_records_the_verdict_right_after_attempt_ended(tmp_path):
    run = _run(tmp_path)
    _rank(run, 1, events.Failed(cls=FailureClass.crash, error="ValueError: bad shard 17"))
    view = attempt_view(run, "7", 0, 0)
    supervise._close(run, view, judge(view, 1, list(HOSTS), 0.0), 1, WHERE)
    rows = run.run_events()
    [ended] = [e for e in rows if isinstance(e, events.AttemptEnded)]
    [verdict] = [e for e in rows if isinstance(e, events.AttemptVerdict)]
    assert rows.index(verdict) == rows.index(ended) + 1 and verdict.time - ended.time < 10
    assert (verdict.attempt, verdict.job_id, verdict.culprit_rank) == (1, "7", 1)


def test_status_and_logs_show_the_newest_verdict(tmp_path, capsys):
    run = _run(tmp_path)
    run.record(
        events.AttemptVerdict(
            cls=FailureClass.hang,
            culprit_rank=1,
            culprit_node="n2",
            confidence="high",
            evidence=("missing heartbeats: ranks 1 reported nothing",),
        ),
        **WHERE,
    )
    _, _, line = notes(run.run_events())
    assert line == "verdict: attempt 1 hang: culprit node n2 (rank 1), confidence high"
    run.record(
        events.AttemptVerdict(cls=FailureClass.crash, no_culprit=culprit.USER, confidence="high"),
        **{**WHERE, "attempt": 2},
    )
    _, _, line = notes(run.run_events())
    assert line == "verdict: attempt 2 crash: no culprit (configuration/user), confidence high"
    assert logs.verdict_lines(run) == [
        "verdict: attempt 1 hang: culprit node n2 (rank 1), confidence high",
        "  evidence: missing heartbeats: ranks 1 reported nothing",
        "verdict: attempt 2 crash: no culprit (configuration/user), confidence high",
    ]
    assert logs.verdict_lines(run, attempt=2) == logs.verdict_lines(run)[2:]
