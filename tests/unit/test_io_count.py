"""compute/io_count.py: the restart bench's counters count the run directory's opens, bytes and
metadata calls (not other paths'), and stop at the first step."""

from __future__ import annotations

import os
from pathlib import Path

from slurmtrain.compute import io_count


def test_counts_shared_tier_reads_metadata_and_bytes_only(tmp_path: Path, monkeypatch) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "env"
    monkeypatch.setenv("SLURMTRAIN_STAGED_ENV", str(elsewhere))
    run.mkdir()
    elsewhere.mkdir()
    (run / "manifest.json").write_text("x" * 10)
    (elsewhere / "mod.py").write_text("y")
    counts = io_count.Counts(run)
    stat = counts.counting(os.stat, "metadata")
    counts.hook("open", (str(run / "manifest.json"), "r", 0))
    counts.hook("open", (str(run / "step_000004" / "rank3.pt"), "rb", 0))  # missing: no bytes
    counts.hook("open", (str(run / "ledger.jsonl"), "a", 0))
    counts.hook("open", (str(elsewhere / "mod.py"), "r", 0))
    counts.hook("os.listdir", (str(run),))
    counts.hook("os.listdir", (str(elsewhere),))
    stat(run / "manifest.json")
    stat(elsewhere / "mod.py")
    counts.active = False  # after the first step nothing counts
    counts.hook("open", (str(run / "manifest.json"), "r", 0))
    stat(run / "manifest.json")
    got = counts.report(0, "n1")
    assert (got["files_read"], got["files_written"], got["bytes_read"]) == (2, 1, 10)
    assert (got["metadata"], got["env_files"], got["env_staged"]) == (2, 1, 1)
    assert got["read_paths"] == {"manifest.json": 1, "step_#/rank#.pt": 1}
    assert got["stat_paths"] == {".": 1, "manifest.json": 1}
