"""Phases with their own deadlines: the arithmetic, the watchdog's phases, the IO heartbeats."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmtrain.common.schema import FaultsConfig
from slurmtrain.compute.checkpoint.beats import Beats
from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.planning import deadlines as phases
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


def test_io_deadlines_scale_with_the_job_s_bytes_over_the_planned_rates_before_any_measurement():
    d = phases.from_config(FaultsConfig(), [], world=4)
    assert not d.write_measured and not d.read_measured
    assert d.write_bps == 1000 * MB and d.read_bps == 2000 * MB  # the whole job's
    # floor + a rank's bytes x world size / the job's rate x safety
    assert d.save_s(0) == 300
    assert d.save_s(250 * MB) == pytest.approx(300 + 1 * 3)
    assert d.read_s(1000 * MB) == pytest.approx(300 + 2 * 3)
    assert d.fixed("step") == 600 and d.fixed(phases.HEALTH) == 1800
    # 66B on 512 ranks under ZeRO-3: ~2 GB a rank, ~1 TB for the job, a save planned at ~15 min
    per_rank = phases.checkpoint_bytes_per_rank(66_000_000_000, 512, 3)
    assert 1.5e9 < per_rank < 2.2e9
    big = phases.from_config(FaultsConfig(), [], world=512)
    assert big.save_s(per_rank) > 900 > 600  # past a step's hang window: its own deadline


def test_measured_rates_replace_the_planned_ones():
    events = [
        {"event": "checkpoint_saved", "bytes": 400 * MB, "total_seconds": 2.0},
        {"event": "checkpoint_saved", "bytes": 400 * MB, "total_seconds": 4.0},  # the slowest
        {"event": "checkpoint_saved", "rank_bytes": 500 * MB, "world_size": 2, "seconds": 1.0},
        {"event": "checkpoint_verified", "ok": True, "bytes": 900 * MB, "seconds": 1.0},
        {"event": "checkpoint_verified", "ok": False, "bytes": 900 * MB, "seconds": 0.01},
        {"event": "checkpoint_loaded", "rank_bytes": 150 * MB, "world_size": 2, "seconds": 1.0},
    ]
    d = phases.from_config(FaultsConfig(), events, world=2)
    assert d.write_measured and d.write_bps == 100 * MB  # the slowest of the last saves
    assert d.read_measured and d.read_bps == pytest.approx(600 * MB)  # median; failed one ignored
    assert d.summary()["write_rate"] == "measured"


# ---- the watchdog's phases (a fake clock) -------------------------------------------------------


def test_a_phase_has_its_own_deadline_and_a_hang_report_names_it():
    clock = Clock()
    dog = _watchdog(clock)
    dog.phase(phases.VERIFY, 100.0, "verifying step_20")
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
    with dog.during(phases.SAVE, 30.0):
        for _ in range(5):  # 100 s of saving in all, a beat every 20 s
            clock.now += 20
            dog.beat("shard")
            assert dog.overdue() is None
        assert dog.current == phases.SAVE
    assert dog.current == "step" and dog.deadline_s == 10.0
    clock.now += 11
    assert "phase step" in dog.overdue()


def test_io_progress_beats_only_its_own_phase():
    """A background writer must not keep a stalled step alive."""
    clock = Clock()
    dog = _watchdog(clock)
    beat = dog.progress(phases.SAVE, "writing shards")
    clock.now += 11
    beat(1 << 20)
    assert "phase step" in dog.overdue()
    dog.phase(phases.SAVE, 30.0)
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
    beats = Beats(dog, phases.from_config(FaultsConfig()))
    assert set(beats.writer_kwargs(NewWriter)) == {"progress"}
    assert beats.writer_kwargs(OldWriter) == {}
    assert Beats(None, None).writer_kwargs(NewWriter) == {}
    progress = beats.writer_kwargs(NewWriter)["progress"]
    shards: list[str] = []
    hook = beats.hook(lambda step, name: shards.append(name))
    with beats.phase(phases.SAVE, lambda d: 30.0):
        clock.now += 25
        progress(4096)  # the new writer's per-chunk beat
        clock.now += 25
        hook(10, "zero_pp_rank_0.pt")  # the per-shard hook beats too, then calls the injector's
        clock.now += 25
        assert dog.overdue() is None and shards == ["zero_pp_rank_0.pt"]


def test_the_loader_beats_per_file_and_the_engine_gets_its_own_load_back(tmp_path):
    clock = Clock()
    dog = _watchdog(clock)
    beats = Beats(dog, phases.from_config(FaultsConfig()))

    class Engine:
        def load(self, path, map_location=None):
            clock.now += 25  # each file takes 25 s; the phase allows 30 s between beats
            return path

    engine = SimpleNamespace(checkpoint_engine=Engine())
    assert beats.load_phase() == "load"  # a rollback; `startup:load` while starting
    with beats.phase(phases.LOAD, lambda d: 30.0), beats.loading(engine, phases.LOAD):
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

    def fake_run(cmd, **kwargs):  # the converter's view: affinity and worker counts
        seen["affinity"] = os.sched_getaffinity(0)
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, "", "stopped here")

    monkeypatch.setattr(reshape.subprocess, "run", fake_run)
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
    from slurmtrain.batch.supervise import classify

    waiting = {"event": "failed", "class": "hang", "node": None, "host": "n1", "rank": 0}
    verdict = classify(
        5, [waiting, {**waiting, "rank": 1, "host": "n2"}], [], ["n1", "n2"], 0, False
    )
    assert verdict.cls == "hang" and not verdict.nodes and not verdict.exclude
    stuck = {"event": "failed", "class": "hang", "node": "n2", "rank": 1}
    verdict = classify(5, [stuck], [], ["n1", "n2"], 0, False)
    assert verdict.cls == "hang" and verdict.nodes == ["n2"]
