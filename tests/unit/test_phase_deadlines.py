"""Phases with their own deadlines: the arithmetic, the watchdog's phases, the IO heartbeats."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmtrain.common import events
from slurmtrain.common.schema import FaultsConfig
from slurmtrain.compute.checkpoint.beats import Beats
from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.planning import deadlines
from tests.conftest import run_cli, slurmtrain_env

MB = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watchdog(clock: Clock, step_s: float = 10.0) -> Watchdog:
    return Watchdog(step_s, Path("/nonexistent"), lambda why: None, 42, clock=clock, phase="step")


# ---- arithmetic -------------------------------------------------------------------------------


OPT13B = 12_853_473_280  # planning.shapes.param_count of conf/model/opt13b.yaml


def test_io_deadlines_come_from_the_bytes_a_phase_moves_at_the_per_node_rate_times_nodes():
    """opt13b, ZeRO-2, bf16 on 64 x 8: a save is the sum of the ranks' shards (12 bytes a
    parameter over 512 ranks; the module file holds no weights) written at once at 1 GB/s per
    node x 64 nodes: seconds, not hours."""
    d = deadlines.from_config(FaultsConfig(), [], world=512, nodes=64)
    assert not d.write_measured and not d.read_measured
    assert d.write_bps == 1000 * MB and d.read_bps == 2000 * MB  # per node
    assert d.save_s(0) == 300 and d.fixed("step") == 600 and d.fixed(deadlines.HEALTH) == 1800
    lay = deadlines.layout(OPT13B, world=512, per_node=8, zero_stage=2, weight_bytes=2)
    assert lay.save.total == pytest.approx(12 * OPT13B, rel=1e-6)  # the sum, not max x world
    assert lay.save.rank == pytest.approx(12 * OPT13B / 512, rel=1e-6)  # 301 MB
    assert lay.save.node == pytest.approx(8 * 12 * OPT13B / 512, rel=1e-6)
    # each rank reads its own shard: 8 a node, no private copy of the whole model
    assert lay.load.node == pytest.approx(8 * lay.load.rank, rel=1e-6)
    save = d.seconds(lay.save, write=True)
    assert 1 < save < 5  # 154 GB over 64 GB/s: ~2.4 s
    assert d.save_s(lay.save) == pytest.approx(300 + 3 * save)
    assert d.save_s(lay.save) < 10 * 60 and d.read_s(lay.load) < 20 * 60
    # without ZeRO rank 0 writes the whole module once, and every rank reads it
    zero0 = deadlines.layout(OPT13B, world=512, per_node=8, zero_stage=0, weight_bytes=2)
    assert zero0.save.total == pytest.approx(14 * OPT13B, rel=1e-6)
    assert d.build_s(lay.save.rank) == d.startup_s  # building moves no bulk IO
    assert d.convert_s(lay.save.total) < 60 * 60  # one node reads and writes it all
    # ten times the nodes: the same busiest node, the same deadline (O(1) in the world size)
    big = deadlines.from_config(FaultsConfig(), [], world=5120, nodes=640)
    wide = deadlines.layout(OPT13B, world=5120, per_node=8, zero_stage=2, weight_bytes=2)
    assert big.save_s(wide.save) <= d.save_s(lay.save)


def test_a_save_stuck_for_three_times_its_planned_time_is_caught():
    d = deadlines.from_config(FaultsConfig(io_floor_s=10.0), [], world=512, nodes=64)
    lay = deadlines.layout(OPT13B, world=512, per_node=8, zero_stage=2, weight_bytes=2)
    planned = d.seconds(lay.save, write=True)
    deadline = d.save_s(lay.save)
    assert deadline == pytest.approx(10 + 3 * planned)  # faults.io_safety=3
    clock = Clock()
    dog = _watchdog(clock)
    dog.phase(deadlines.SAVE, deadline, "saving step_3000")
    clock.now += 3 * planned  # slow, still within its allowance
    assert dog.overdue() is None
    clock.now += 10 + 1  # no beat for 3x its planned time plus the floor: a hang
    assert "phase save" in dog.overdue()


def test_a_rank_s_bytes_alone_still_give_minutes_on_the_compute_side():
    """The trainer passes the busiest rank's planned bytes (planned_state_bytes) before the
    first save; the attempt's node count comes from its `started` row."""
    cfg = SimpleNamespace(
        model=SimpleNamespace(
            num_layers=40,
            hidden_size=5120,
            num_heads=40,
            ffn_dim=20480,
            vocab_size=50272,
            max_positions=2048,
            word_embed_proj_dim=None,
        ),
        deepspeed=SimpleNamespace(stage=2, dtype="bf16"),
        gpus_per_node=8,
    )
    started = events.Started(world_size=512, nodes=tuple(f"g{i}" for i in range(64)))
    d = deadlines.from_config(FaultsConfig(), [started], world=512)
    assert d.nodes == 64 and d.row().node_count == 64
    rank = deadlines.planned_state_bytes(cfg, 512)
    # ZeRO-2: the fp32 partitions and moments only (the module file holds no weights): 301 MB
    assert rank == pytest.approx(12 * OPT13B / 512, rel=1e-3)
    assert d.save_s(rank) < 30 * 60 and d.read_s(rank) < 30 * 60
    assert deadlines.from_config(FaultsConfig(), [], world=512).save_s(rank) > d.save_s(rank)
    # given what the whole save moves (planned_save), the trainer's deadline is the plan's
    whole = deadlines.planned_save(cfg, 512, 64)
    lay = deadlines.layout(OPT13B, world=512, per_node=8, zero_stage=2, weight_bytes=2)
    assert whole == lay.save and d.save_s(whole) < 10 * 60


def test_measured_rates_replace_the_planned_ones():
    """A measured save: the ledger's `bytes` are all ranks' (a per-node rate over its nodes);
    its `rank_bytes` over its seconds time the next save of the busiest rank."""
    two = ("n1", "n2")
    saved = events.CheckpointSaved(
        bytes=400 * MB, rank_bytes=200 * MB, total_seconds=2.0, nodes=two
    )
    ledger_rows = [
        saved,
        events.CheckpointSaved(
            bytes=400 * MB, rank_bytes=200 * MB, total_seconds=4.0, seconds=0.5, nodes=two
        ),  # the slowest (until published: an async save's loop waited only 0.5 s)
        events.CheckpointVerified(
            ok=True, bytes=900 * MB, rank_bytes=450 * MB, seconds=1.0, nodes=two
        ),
        events.CheckpointVerified(ok=False, bytes=900 * MB, seconds=0.01),
        events.CheckpointLoaded(rank_bytes=150 * MB, world_size=2, seconds=1.0, nodes=two),
        events.Started(world_size=2, nodes=two),  # neither a save nor a read
    ]
    d = deadlines.from_config(FaultsConfig(), ledger_rows, world=2, nodes=2)
    assert d.write_measured and d.write_bps == 50 * MB  # 400 MB / 4 s / 2 nodes
    assert d.read_measured and d.read_bps == pytest.approx(300 * MB)  # median; failed one ignored
    assert d.row().write_rate == "measured" and d.row().read_rate == "measured"
    assert d.save_s(200 * MB) == pytest.approx(300 + 4.0 * 3)  # as long as the slowest save
    # reads keep the per-node model: a verification (one rank checks the module file) does not
    # time a load (every rank reads it)
    assert d.read_s(150 * MB) == pytest.approx(300 + 150 / 300 * 3)


# ---- the watchdog's phases (a fake clock) -------------------------------------------------------


def test_a_phase_has_its_own_deadline_and_a_hang_report_names_it():
    clock = Clock()
    dog = _watchdog(clock)
    dog.phase(deadlines.VERIFY, 100.0, "verifying step_20")
    clock.now += 50  # past the step's 10 s: not a hang while verifying
    assert dog.overdue() is None
    clock.now += 51
    why = dog.overdue()
    assert why is not None
    assert "phase startup:verify" in why and "deadline 100 s" in why and "verifying step_20" in why
    dog.phase("step", 10.0)  # a phase change: a new deadline counted from now
    assert dog.overdue() is None
    clock.now += 11
    assert "phase step" in dog.overdue()


def test_beats_extend_the_phase_and_during_gives_the_previous_phase_back():
    clock = Clock()
    dog = _watchdog(clock)
    with dog.during(deadlines.SAVE, 30.0):
        for _ in range(5):  # 100 s of saving in all, a beat every 20 s
            clock.now += 20
            dog.beat("shard")
            assert dog.overdue() is None
        assert dog.current == deadlines.SAVE
    assert dog.current == "step" and dog.deadline_s == 10.0
    clock.now += 11
    assert "phase step" in dog.overdue()


def test_io_progress_beats_only_its_own_phase():
    """A background writer must not keep a stalled step alive."""
    clock = Clock()
    dog = _watchdog(clock)
    beat = dog.progress(deadlines.SAVE, "writing shards")
    clock.now += 11
    beat(1 << 20)
    assert "phase step" in dog.overdue()
    dog.phase(deadlines.SAVE, 30.0)
    clock.now += 29
    beat(2 << 20)
    clock.now += 29
    assert dog.overdue() is None and "2,097,152 bytes" in dog.what


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from slurmtrain.compute.faults.watchdog import Watchdog

    record = Path(sys.argv[1])
    dog = Watchdog(60.0, Path(sys.argv[2]), lambda why: record.write_text(why), 42, phase="step")
    dog.start()
    dog.phase(sys.argv[3], float(sys.argv[4]))
    time.sleep(120)  # stalls in that phase
    """
)


def test_a_rank_stalled_in_a_phase_is_killed_after_that_phase_s_deadline(tmp_path):
    """The step's deadline is 60 s; the child stalls in `save` (0.5 s): it exits with the hang
    code well before the step's deadline (the subprocess timeout is 30 s), naming the phase."""
    record = tmp_path / "record.txt"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(record), str(tmp_path / "stacks.txt"), "save", "0.5"],
        env=slurmtrain_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 42, done.stderr
    assert "(phase save, deadline 0.5 s)" in record.read_text()


# ---- heartbeats of the writer and loader ---------------------------------------------------------


class NewWriter:
    def __init__(self, zipfile: bool, verify: str, hook=None, progress=None) -> None:
        self.progress = progress


class OldWriter:
    def __init__(self, zipfile: bool, verify: str, hook=None) -> None:
        pass


def test_the_writer_gets_progress_only_when_its_engine_takes_it_and_its_hook_beats():
    clock = Clock()
    dog = _watchdog(clock)
    beats = Beats(dog, deadlines.from_config(FaultsConfig()))
    assert set(beats.writer_kwargs(NewWriter)) == {"progress"}
    assert beats.writer_kwargs(OldWriter) == {}
    assert Beats(None, None).writer_kwargs(NewWriter) == {}
    progress = beats.writer_kwargs(NewWriter)["progress"]
    shards: list[str] = []
    hook = beats.hook(lambda step, name: shards.append(name))
    with beats.phase(deadlines.SAVE, lambda d: 30.0):
        clock.now += 25
        progress(4096)  # the new writer's per-chunk beat
        clock.now += 25
        hook(10, "zero_pp_rank_0.pt")  # the per-shard hook beats too, then calls the injector's
        clock.now += 25
        assert dog.overdue() is None and shards == ["zero_pp_rank_0.pt"]


def test_the_loader_beats_per_file_and_the_engine_gets_its_own_load_back(tmp_path):
    clock = Clock()
    dog = _watchdog(clock)
    beats = Beats(dog, deadlines.from_config(FaultsConfig()))

    class Engine:
        def load(self, path, map_location=None):
            clock.now += 25  # each file takes 25 s; the phase allows 30 s between beats
            return path

    engine = SimpleNamespace(checkpoint_engine=Engine())
    assert beats.load_phase() == "load"  # a rollback; `startup:load` while starting
    with beats.phase(deadlines.LOAD, lambda d: 30.0), beats.loading(engine, deadlines.LOAD):
        for name in ("a.pt", "b.pt", "c.pt"):
            assert engine.checkpoint_engine.load(str(tmp_path / name)) == str(tmp_path / name)
            assert dog.overdue() is None
    assert "load" not in vars(engine.checkpoint_engine)


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arg,named",
    [
        ("faults.io_safety=0.5", "faults.io_safety=0.5"),
        ("faults.io_floor_s=0", "faults.io_floor_s=0"),
    ],
)
def test_bad_deadline_keys_are_one_line_exit_2(arg, named, workdir):
    done = run_cli([arg], cwd=workdir)
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], lines


# ---- ds_to_universal on the node's cores ---------------------------------------------------------


def test_ds_to_universal_runs_on_every_core_of_the_node_and_the_task_keeps_its_own(
    tmp_path, monkeypatch
):
    import os

    from slurmtrain.compute.checkpoint import reshape

    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        pytest.skip("needs Linux affinity and two cores")
    seen: dict = {}

    class FakePopen:  # the converter's view at its start: affinity and worker counts
        def __init__(self, cmd, **kwargs):
            seen["affinity"] = os.sched_getaffinity(0)
            seen["cmd"] = cmd
            self.pid, self.returncode = -1, 1

        def communicate(self, timeout=None):
            return "", "stopped here"

    monkeypatch.setattr(reshape.subprocess, "Popen", FakePopen)
    (tmp_path / "step_10").mkdir()
    result: dict = {}

    def task() -> None:  # a thread bound to one core, like an srun task with --cpu-bind=cores
        os.sched_setaffinity(0, {0})
        try:
            reshape.convert(tmp_path / "step_10", {"step": 10, "time": 1.0})
        except reshape.ReshapeError as err:
            result["error"] = str(err)
        result["after"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=task)
    thread.start()
    thread.join()
    everything = set(range(os.cpu_count() or 1)) & os.sched_getaffinity(0)
    assert seen["affinity"] == everything and len(everything) > 1
    cmd = seen["cmd"]
    workers = str(len(everything))
    assert cmd[cmd.index("--num_extract_workers") + 1] == workers
    assert cmd[cmd.index("--num_merge_workers") + 1] == workers
    assert result["after"] == {0} and "stopped here" in result["error"]


def test_a_rendezvous_hang_blames_no_waiting_node_but_a_later_start_up_hang_names_its_own():
    """Rows as compute/attempt.py writes them before `started` (the supervisor's classify)."""
    import dataclasses

    from slurmtrain.batch.supervise import classify
    from slurmtrain.common.events import Failed, FailureClass

    waiting = Failed(cls=FailureClass.hang, node=None, host="n1", rank=0)
    verdict = classify(
        5, [waiting, dataclasses.replace(waiting, rank=1, host="n2")], [], ["n1", "n2"], 0, False
    )
    assert verdict.cls == FailureClass.hang and not verdict.nodes and not verdict.exclude
    stuck = Failed(cls=FailureClass.hang, node="n2", rank=1)
    verdict = classify(5, [stuck], [], ["n1", "n2"], 0, False)
    assert verdict.cls == FailureClass.hang and verdict.nodes == ["n2"]
