"""Classification of failures, attempts keyed by (job id, restart count), exclusions that expire
and fit the partition, and the login side's fail-closed state.

Ledger rows as the ranks and the supervisor write them; no Slurm behaviour is faked: where Slurm
would be asked, the test either leaves nothing to ask or makes Slurm's commands unreachable.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from slurmtrain.batch import exclusions, supervise
from slurmtrain.common import events, ledger, schema
from slurmtrain.common.events import FailureClass, Row, parse
from slurmtrain.common.rundir import RunDir, StateUnknown, create, locate
from slurmtrain.login.prepare import resolve

schema.register()

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
PEER = "RuntimeError: [../third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
NCCL_LOCAL = "torch.distributed.DistBackendError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO)"
STARTED = events.Started(job_id="7", attempt=1, hosts=("n1", "n2"), restart=0)


def _failed(rank, cls, error, attempt=1, step=12, **more):
    return events.Failed(
        job_id="7", attempt=attempt, rank=rank, cls=cls, error=error, step=step, **more
    )


def test_a_real_error_outranks_hang_rows_and_oom_is_its_own_class_with_node_and_step():
    rows = [_failed(0, "hang", "no progress for 600 s after step 12"), _failed(1, "crash", OOM)]
    verdict = supervise.classify(1, rows, [STARTED, *rows], ["n1", "n2"], wait_s=0)
    assert verdict.cls == "oom" and verdict.nodes == ["n2"] and not verdict.exclude
    verdict = supervise.classify(5, rows, [STARTED, *rows], ["n1", "n2"], wait_s=0)  # EXIT_HANG
    assert verdict.cls == "oom"
    cpu = _failed(0, "crash", "RuntimeError: DefaultCPUAllocator: can't allocate memory")
    assert supervise.classify(1, [cpu], [STARTED, cpu], [], 0).cls == "oom"
    assert ledger.vanished_class([STARTED, *rows], 1) == FailureClass.oom
    assert ledger.budgets(schema.FaultsConfig())[FailureClass.oom] == 3


def test_a_local_cuda_error_names_and_excludes_its_node_instead_of_counting_as_a_peer_error():
    local = _failed(1, "crash", NCCL_LOCAL)
    peer = _failed(0, "crash", PEER)
    assert not ledger.is_peer_error([local, peer]) and ledger.is_peer_error([peer])
    verdict = supervise.classify(1, [peer, local], [STARTED, peer, local], ["n1", "n2"], 0)
    assert verdict.cls == "node_failure" and verdict.nodes == ["n2"]
    assert "unhandled cuda error" in verdict.exclude["n2"]
    for text in (
        "CUDA error: an illegal memory access was encountered",
        "Xid 79: GPU fell off",
        "uncorrectable ECC error encountered",
        "DeviceError: gpus_per_node=8 but this task sees no CUDA device (CUDA_VISIBLE_DEVICES='0')",
        "RuntimeError: No CUDA GPUs are available",
    ):
        row = dataclasses.replace(local, error=text, node="n1")
        assert supervise.classify(1, [row], [STARTED, row], [], 0).exclude == {"n1": ANY_REASON}


class _Any:
    def __eq__(self, other):
        return isinstance(other, str) and other.startswith("device error")


ANY_REASON = _Any()


def test_a_hang_before_started_is_attributed_to_the_stuck_ranks_node():
    hung = _failed(1, "hang", "no progress for 600 s after start-up", attempt=None, node="n2")
    verdict = supervise.classify(5, [hung], [hung], ["n1", "n2"], 0, started=False)
    assert verdict.cls == "hang" and verdict.exclude == {"n2": "hang before started"}
    assert (
        supervise.classify(5, [dataclasses.replace(hung, attempt=1)], [STARTED], [], 0).exclude
        == {}
    )


def test_a_rendezvous_that_timed_out_blames_the_step_nodes_whose_ranks_never_joined():
    # Ranks 0-1 (n1) and 4-5 (n3) joined at t=70 and gave up at t=100; n2's ranks never arrived.
    step = ["n1", "n2", "n3"]

    def waited(rank, host, arrived_at=70.0, time=100.0):
        return _failed(
            rank,
            "hang",
            "no progress (waiting for ranks to join)",
            attempt=None,
            node=None,
            host=host,
            phase="startup:rendezvous",
            step_nodes=tuple(step),
            arrived_at=arrived_at,
            time=time,
        )

    hung = [waited(0, "n1"), waited(1, "n1"), waited(4, "n3"), waited(5, "n3", time=101.0)]
    verdict = supervise.classify(5, hung, hung, step, 0, started=False)
    assert verdict.cls == "hang" and verdict.nodes == ["n2"]
    assert verdict.exclude == {"n2": "its ranks never joined the rendezvous"}
    # n2's rank woke when the step was killed (Slurm sends SIGCONT with SIGTERM) and joined late,
    # or never joined at all and wrote its row anyway: n2 is still the one to blame
    for late in (waited(2, "n2", arrived_at=104.0, time=106.0), waited(2, "n2", arrived_at=None)):
        verdict = supervise.classify(5, hung + [late], hung + [late], step, 0, started=False)
        assert verdict.nodes == ["n2"], late
    # every node's ranks joined in time (a stall elsewhere), or none did (a shared cause):
    # nobody is blamed
    everyone = hung + [waited(2, "n2")]
    assert supervise.classify(5, everyone, everyone, step, 0, started=False).exclude == {}
    nobody = [waited(r, h, arrived_at=None) for r, h in ((0, "n1"), (2, "n2"), (4, "n3"))]
    assert supervise.classify(5, nobody, nobody, step, 0, started=False).exclude == {}


def test_node_check_default_follows_the_clusters_slurmd_timeout():
    from slurmtrain.batch import supervise
    from slurmtrain.common.slurm_text import slurmd_timeout_s

    assert schema.FaultsConfig().node_check_s == 0  # 0: SlurmdTimeout + 30 s of this cluster
    text = "SlurmctldTimeout        = 120 sec\nSlurmdTimeout           = 300 sec\n"
    assert slurmd_timeout_s(text) == 300 and slurmd_timeout_s("") is None
    cfg = OmegaConf.create({"faults": {"node_check_s": 45.0}})
    assert supervise.node_check_s(cfg) == 45.0


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    return resolve(cfg)


def _run_with(tmp_path, rows, *overrides):
    cfg = _cfg(tmp_path, "name=sup", *overrides)
    run = locate(cfg)
    create(run, cfg, [])
    for row in rows:
        run.record(row if isinstance(row, Row) else parse(row))
    return run


def _stops(run):
    return [e for e in run.events() if isinstance(e, events.Stopped)]


def _ended(run):
    return [e for e in run.events() if isinstance(e, events.AttemptEnded)]


def test_a_start_that_dies_before_started_does_not_inherit_the_previous_outcome(tmp_path):
    # Attempt 1 of job 7 was stopped by its time-limit signal and requeued (same job id); the
    # requeued start (SLURM_RESTART_COUNT=1) fails in rendezvous, before `started`.
    rows = [
        STARTED,
        {"event": "signal", "job_id": "7", "attempt": 1, "signal": "SIGUSR2", "step": 5},
        {"event": "attempt_ended", "job_id": "7", "attempt": 1, "class": "timed_out"},
        {"event": "requeued", "job_id": "7", "attempt": 1, "new_job_id": "7", "how": "requeue"},
    ]
    run = _run_with(tmp_path, rows, "faults.max_crash=0", "faults.node_check_s=0")
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}
    assert supervise.supervise(str(run.path), 1, env) != 0
    [first, second] = _ended(run)
    assert second.cls == FailureClass.crash and second.before_started and second.attempt is None
    assert second.restart == 1
    assert _stops(run)[-1].cls == FailureClass.crash


def test_a_start_after_a_preemption_that_dies_before_started_is_not_recorded_cancelled(tmp_path):
    rows = [
        STARTED,
        {"event": "signal", "job_id": "7", "attempt": 1, "signal": "SIGTERM", "step": 5},
    ]
    run = _run_with(tmp_path, rows, "faults.max_crash=0", "faults.node_check_s=0")
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}
    supervise.supervise(str(run.path), 1, env)
    assert [e.cls for e in _ended(run)] == [FailureClass.crash]
    assert ledger.attempt_of(run.events(), "7", 0) == 1
    assert ledger.attempt_of(run.events(), "7", 1) is None


def test_a_refused_duplicate_is_neither_restarted_nor_recorded_stopped(tmp_path):
    run = _run_with(tmp_path, [STARTED])
    before = run.events()
    assert supervise.supervise(str(run.path), 7, {"SLURM_JOB_ID": "8"}) == 0
    assert run.events() == before


def test_exclusions_expire_after_exclude_hours():
    now = time.time()
    rows = [
        {"node": "n1", "reason": "device error", "time": now - 25 * 3600},
        {"node": "n2", "reason": "health", "time": now - 3600},
        {"node": "n3", "reason": "straggler", "time": now},
    ]
    assert sorted(exclusions.active(rows, 24, now)) == ["n2"]
    assert sorted(exclusions.active(rows, -1, now)) == ["n1", "n2"]


def test_exclusions_never_leave_the_partition_too_few_nodes_newest_kept():
    now = time.time()
    failed = {f"n{i}": {"node": f"n{i}", "reason": "health", "time": now - i} for i in (1, 2, 3)}
    part = ["n1", "n2", "n3", "n4"]
    got = exclusions.fit(failed, [], part, needed=2)
    assert got.nodes == ["n1", "n2"] and got.dropped == ["n3"] and got.problem is None
    assert exclusions.fit(failed, [], part, needed=4).nodes == []
    user = exclusions.fit(failed, ["n1", "n2", "n3"], part, needed=2)
    assert user.problem and "no node set can run the job" in user.problem


def test_a_node_that_fails_again_after_its_retry_stays_excluded_and_turns_end_in_a_stop():
    """Two broken nodes, one needed: each is retried once, then no node set can run the job
    (before, the oldest exclusion was always dropped and the run took turns on them)."""
    now, part = time.time(), ["n5", "n6"]
    rows = []

    def next_fit():
        return exclusions.fit(exclusions.active(rows, 24, now + 10), [], part, needed=1)

    for job, node in (("1505", "n6"), ("1506", "n5"), ("1507", "n6"), ("1508", "n5")):
        rows.append({"node": node, "reason": "device error", "time": now, "job_id": job})
        now += 1
        got = next_fit()
        if job == "1505":
            assert got.nodes == ["n6"] and got.problem is None
        elif job == "1506":  # n5 newest, n6 (once) is tried again
            assert got.nodes == ["n5"] and got.dropped == ["n6"] and got.problem is None
        elif job == "1507":  # n6 failed again after its retry: it stays out; n5 gets its retry
            assert got.nodes == ["n6"] and got.dropped == ["n5"] and got.problem is None
    assert got.problem and "n5, n6 failed again after a retry" in got.problem
    assert got.nodes == ["n5", "n6"]
    one_job = [{"node": "n5", "reason": "health", "time": now, "job_id": "9"}] * 2
    assert exclusions.active(one_job, 24, now)["n5"]["jobs"] == 1  # two rows, one attempt
    requeued = [{**one_job[0], "restart": r} for r in (0, 1)]  # the same job id, requeued
    assert exclusions.active(requeued, 24, now)["n5"]["jobs"] == 2


def test_when_no_node_set_can_run_the_job_the_run_stops_saying_so(tmp_path):
    rows = [STARTED, _failed(1, "crash", NCCL_LOCAL)]
    run = _run_with(
        tmp_path, rows, "nodes=2", "cluster.exclude='n[1-3]'", "cluster.partition=debug"
    )
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    try:
        code = supervise.supervise(str(run.path), 1, env)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"needs the test cluster's partitions: {err}")
    [stop] = _stops(run)
    if "no node set" not in stop.error:
        pytest.skip("the test cluster's partitions are not reachable")
    assert code != 0 and stop.cls == FailureClass.no_nodes
    assert "n1 (cluster.exclude)" in stop.error and "n2 (device error" in stop.error


def test_the_state_fails_closed_when_slurm_cannot_be_asked(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.record(events.Submitted(executor="slurm"), job_id="123")
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    with pytest.raises(StateUnknown, match="neither squeue nor sacct answered"):
        run.state()


def test_the_owner_is_the_newest_submission_or_start():
    rows = [
        events.Submitted(job_id="5"),
        events.Started(job_id="5", attempt=1),
        events.Started(job_id="9", attempt=2),
        events.DuplicateRefused(job_id="11"),
    ]
    owner = ledger.owner(rows)
    assert owner is not None and owner.job_id == "9"


def test_a_health_gate_failure_is_a_node_failure_whatever_srun_returned():
    """kill-on-bad-exit may end the healthy ranks by signal first (srun then says 143): the
    attempt's `bad_node` rows decide, so the supervisor does not wait for Slurm to mark a node."""
    from slurmtrain.batch import supervise
    from slurmtrain.common import errors

    rows = [events.Started(attempt=1), events.BadNode(node="n2", attempt=1)]
    assert supervise._effective_rc(143, rows) == errors.EXIT_BAD_NODE
    assert supervise._effective_rc(0, rows) == 0
    assert supervise._effective_rc(143, rows[:1]) == 143
