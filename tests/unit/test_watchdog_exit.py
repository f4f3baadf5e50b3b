"""The watchdog's exit never waits on the filesystem: a dump or record that blocks is abandoned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import slurmtrain_env

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from slurmtrain.compute.faults.watchdog import Watchdog

    stacks, record = Path(sys.argv[1]), Path(sys.argv[2])

    def on_hang(why):
        with open(record, "w") as f:  # the ledger write: blocks too when record is a FIFO
            f.write(why)

    Watchdog(0.4, stacks, on_hang, 42, write_s=float(sys.argv[3])).start()
    time.sleep(120)  # the "hang"
    """
)


def _run(stacks: Path, record: Path, write_s: float) -> tuple[int, float, str]:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(stacks), str(record), str(write_s)],
        env=slurmtrain_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, time.monotonic() - t0, done.stderr


def test_exit_within_the_deadline_when_every_write_blocks(tmp_path: Path) -> None:
    # A FIFO with no reader: open() for writing blocks forever, like a stalled NFS server.
    stacks, record = tmp_path / "hangs" / "attempt1.rank0.txt", tmp_path / "ledger.fifo"
    stacks.parent.mkdir()
    os.mkfifo(stacks)
    os.mkfifo(record)
    rc, seconds, err = _run(stacks, record, write_s=1.0)
    assert rc == 42, err
    # 0.4 s timeout + one poll + two bounded writes of 1 s + interpreter start: far below 10 s
    assert seconds < 8, seconds
    assert "stack dump gave up" in err and "hang record gave up" in err
    assert "no progress for" in err  # the stacks still reach the job's log


def test_normal_exit_dumps_stacks_and_records_the_hang(tmp_path: Path) -> None:
    stacks, record = tmp_path / "hangs" / "attempt1.rank0.txt", tmp_path / "record.txt"
    rc, seconds, err = _run(stacks, record, write_s=5.0)
    assert rc == 42, err
    text = stacks.read_text()
    assert text.startswith("no progress for") and "(MainThread)" in text and "line 13" in text
    assert record.read_text().startswith("no progress for 0 s after starting")
