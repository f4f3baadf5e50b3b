"""The universal conversion beats every rank's watchdog while its output grows (checkpoint/reshape.py
`growing`): a conversion longer than its planned deadline is progress; a stalled one still fires.
Only rank 0 looks at the folder; the other hosts learn of it through one reader each."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from slurmtrain.compute.checkpoint.reshape import FOLLOW, RELAY, WALK, growing, shared_note
from slurmtrain.compute.faults.watchdog import Watchdog
from slurmtrain.planning import deadlines


def _writer(folder: Path, files: int, every_s: float) -> threading.Thread:
    """Writes `files` files of 1 KiB into `folder/zero/<n>/`, one every `every_s`, as the
    converter writes one parameter's states after another."""

    def write() -> None:
        for n in range(files):
            (folder / "zero" / str(n)).mkdir(parents=True)
            (folder / "zero" / str(n) / "fp32.pt").write_bytes(b"\0" * 1024)
            time.sleep(every_s)

    return threading.Thread(target=write, daemon=True)


def _converting(tmp_path: Path, deadline_s: float) -> Watchdog:
    watchdog = Watchdog(deadline_s, tmp_path / "hang.txt", lambda why: None, 99)
    watchdog.phase(deadlines.CONVERT, deadline_s, "converting")
    return watchdog


def test_a_conversion_that_keeps_writing_outlives_its_deadline(tmp_path):
    folder = tmp_path / "step_40_universal.tmp"
    watchdog = _converting(tmp_path, deadline_s=0.8)
    writer = _writer(folder, files=12, every_s=0.2)  # 2.4 s of writing: 3x the deadline
    overdue = []
    with growing(folder, watchdog.progress(deadlines.CONVERT, "converting"), every_s=0.1):
        writer.start()
        while writer.is_alive():
            overdue.append(watchdog.overdue())
            time.sleep(0.05)
    assert overdue and set(overdue) == {None}
    assert "12,288 bytes" in watchdog.what


def test_a_conversion_that_stops_writing_still_trips_the_watchdog(tmp_path):
    folder = tmp_path / "step_40_universal.tmp"
    watchdog = _converting(tmp_path, deadline_s=0.8)
    writer = _writer(folder, files=2, every_s=0.1)
    with growing(folder, watchdog.progress(deadlines.CONVERT, "converting"), every_s=0.1):
        writer.start()
        writer.join()
        time.sleep(1.5)  # nothing more written: no beat
        why = watchdog.overdue()
    assert why is not None and f"phase {deadlines.CONVERT}" in why


def test_growth_beats_only_the_conversion_phase(tmp_path):
    """A rank that has left the conversion (its load started) is not kept alive by the folder."""
    folder = tmp_path / "step_40_universal.tmp"
    watchdog = _converting(tmp_path, deadline_s=0.8)
    watchdog.phase(deadlines.BUILD, 0.8, "building")
    writer = _writer(folder, files=10, every_s=0.2)
    with growing(folder, watchdog.progress(deadlines.CONVERT, "converting"), every_s=0.1):
        writer.start()
        writer.join()
    assert watchdog.overdue() is not None and watchdog.what == "building"


def test_a_rank_on_another_host_beats_through_its_hosts_reader(tmp_path):
    """Rank 0 walks the folder; the lowest rank of another host reads rank 0's note into that
    host's note; the host's other ranks read only that: all three outlive the deadline while the
    folder grows, and all three fire once it stops."""
    folder = tmp_path / "step_40_universal.tmp"
    host0, host1 = tmp_path / "shm0.progress", tmp_path / "shm1.progress"
    roles = [(WALK, host0), (RELAY, host1), (FOLLOW, host1)]
    dogs = [_converting(tmp_path, deadline_s=1.2) for _ in roles]
    writer = _writer(folder, files=12, every_s=0.25)  # 3 s of writing: 2.5x the deadline
    overdue = []
    with contextlib.ExitStack() as stack:
        for dog, (role, note) in zip(dogs, roles):
            beat = dog.progress(deadlines.CONVERT, "converting")
            stack.enter_context(growing(folder, beat, every_s=0.1, role=role, note=note))
        writer.start()
        while writer.is_alive():
            overdue += [dog.overdue() for dog in dogs]
            time.sleep(0.05)
        assert overdue and set(overdue) == {None}
        # The last size reaches the followers two polls later; on a loaded machine that can
        # land after the writer's final pause, so wait for it (bounded) instead of racing it.
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle:
            if all(dog.what.endswith("(12,288 bytes)") for dog in dogs[1:]):
                break
            time.sleep(0.02)
        assert all(dog.what.endswith("(12,288 bytes)") for dog in dogs[1:])
        time.sleep(2.0)  # nothing more written: no beat anywhere
        assert all(dog.overdue() is not None for dog in dogs)
    assert not shared_note(folder).exists() and not host0.exists() and not host1.exists()


def test_a_host_whose_reader_is_gone_is_not_kept_alive(tmp_path):
    folder = tmp_path / "step_40_universal.tmp"
    dog = _converting(tmp_path, deadline_s=0.8)
    writer = _writer(folder, files=10, every_s=0.2)
    beat = dog.progress(deadlines.CONVERT, "converting")
    with growing(folder, lambda n: None, every_s=0.1, role=WALK, note=tmp_path / "shm0"):
        with growing(folder, beat, every_s=0.1, role=FOLLOW, note=tmp_path / "shm1"):
            writer.start()
            writer.join()
    assert dog.overdue() is not None and dog.what == "converting"
