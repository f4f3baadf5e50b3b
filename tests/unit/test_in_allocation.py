"""In-allocation restarts: which nodes the next attempt gets, and the batch script that runs it."""

from __future__ import annotations

import subprocess

from omegaconf import OmegaConf

from slurmtrain.batch import in_allocation
from slurmtrain.common import events, ledger
from slurmtrain.common.events import FailureClass
from slurmtrain.common.slurm_text import master_port


def cfg(nodes="2", spares=1, kind="slurm"):
    return OmegaConf.create(
        {"nodes": nodes, "cluster": {"kind": kind}, "faults": {"spare_nodes": spares}}
    )


def test_a_spare_takes_the_failed_nodes_place_and_ranks_keep_their_hosts():
    step = in_allocation.plan(
        cfg(), FailureClass.node_failure, ["n1", "n2", "n3"], ["n1", "n2"], ["n2"], []
    )
    assert step.nodes == ["n1", "n3"] and step.swapped_in == ["n3"] and step.failed == ["n2"]
    assert step.spares_left == 0


def test_a_hang_naming_no_node_restarts_on_the_same_nodes():
    step = in_allocation.plan(cfg(), FailureClass.hang, ["n1", "n2", "n3"], ["n1", "n2"], [], [])
    assert step.nodes == ["n1", "n2"] and step.swapped_in == [] and step.spares_left == 1


def test_excluded_nodes_and_slurm_dropping_a_node_are_respected():
    step = in_allocation.plan(
        cfg(spares=2), FailureClass.crash, ["n1", "n3", "n4"], ["n1", "n2"], [], ["n4"]
    )
    assert step.nodes == ["n1", "n3"] and step.failed == ["n2"]


def test_a_range_shrinks_in_place_when_no_spare_is_left():
    step = in_allocation.plan(
        cfg("2-3", 0), FailureClass.node_failure, ["n1", "n2", "n3"], ["n1", "n2", "n3"], ["n3"], []
    )
    assert step.nodes == ["n1", "n2"] and step.failed == ["n3"]
    # below the range's smaller end: back to requeue/resubmit
    assert (
        in_allocation.plan(
            cfg("2-3", 0), FailureClass.node_failure, ["n1", "n2"], ["n1", "n2"], ["n2"], []
        )
        is None
    )


def test_no_spare_and_fixed_nodes_or_an_incurable_class_falls_back_to_the_queue():
    assert (
        in_allocation.plan(cfg("2", 0), FailureClass.node_failure, ["n1", "n2"], [], ["n2"], [])
        is None
    )
    for cls in (
        FailureClass.oom,
        FailureClass.diverged,
        FailureClass.config_error,
        FailureClass.preempted,
    ):
        assert in_allocation.plan(cfg(), cls, ["n1", "n2", "n3"], ["n1", "n2"], [], []) is None
    assert (
        in_allocation.plan(cfg(kind="local"), FailureClass.hang, ["n1", "n2", "n3"], [], [], [])
        is None
    )


def test_a_crash_on_one_node_swaps_it_out_only_while_a_spare_is_at_hand():
    step = in_allocation.plan(
        cfg(), FailureClass.crash, ["n1", "n2", "n3"], ["n1", "n2"], [], [], optional=["n2"]
    )
    assert step.nodes == ["n1", "n3"]
    step = in_allocation.plan(
        cfg(spares=0, nodes="2-2"), FailureClass.crash, ["n1", "n2"], ["n1", "n2"], [], [], ["n2"]
    )
    assert step is None  # fixed nodes, no spare: not an in-allocation job at all


def test_each_step_of_a_job_gets_its_own_rendezvous_port():
    assert master_port("4242") == master_port("4242", 0)
    ports = {master_port("4242", step) for step in range(8)}
    assert len(ports) == 8 and all(10000 <= p < 32768 for p in ports)


def test_attempts_of_one_job_are_told_apart_by_their_relaunch():
    rows = [
        events.Started(job_id="9", attempt=1, restart=0),
        events.Started(job_id="9", attempt=2, restart=0, relaunch=1),
    ]
    assert ledger.attempt_of(rows, "9", 0) == 1
    assert ledger.attempt_of(rows, "9", 0, 1) == 2
    assert ledger.attempt_of(rows, "9", 0, 2) is None
    assert in_allocation.step_hosts([events.Started(attempt=2, hosts=("n2", "n1", "n2"))], 2) == [
        "n2",
        "n1",
    ]
    assert in_allocation.step_hosts(rows, None) == []


def test_the_batch_script_with_spares_holds_them_and_loops_inside_the_allocation(tmp_path):
    from slurmtrain.common.rundir import locate
    from slurmtrain.login import slurm_submit
    from tests.unit.test_launch_path import _cfg

    cfg = _cfg(tmp_path, "nodes=2", "faults.spare_nodes=1")
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    assert "#SBATCH --nodes=3" in script and "#SBATCH --no-kill" in script
    assert '--nodelist="$hosts"' in script and "SLURMTRAIN_RELAUNCH" in script
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    plain = slurm_submit.render_sbatch(_cfg(tmp_path, "nodes=2"), locate(cfg))
    assert "--no-kill" not in plain and "#SBATCH --nodes=2" in plain


def test_a_node_range_is_not_pinned_to_its_smaller_end(tmp_path):
    # With --ntasks-per-node Slurm derives ntasks from the range's smaller end at submission and
    # never gives more nodes (seen on this cluster: -N2-3 --ntasks-per-node=1 got 2 of 3 idle).
    from slurmtrain.common.rundir import locate
    from slurmtrain.login import slurm_submit
    from tests.unit.test_launch_path import _cfg

    cfg = _cfg(tmp_path, "nodes=2-3", "train.micro_batch_size=1", "train.global_batch_size=6")
    script = slurm_submit.render_sbatch(cfg, locate(cfg))
    assert "#SBATCH --nodes=2-3" in script and "#SBATCH --mincpus=" in script
    assert "#SBATCH --ntasks-per-node" not in script and "--ntasks-per-node=1 " in script
