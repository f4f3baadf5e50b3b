"""Which runs `status` shows (#34 Build 6), without Slurm or a ledger: a run directory, a name
directory (`runs/NAME`), a bare name under the runs root, a glob; `--state` words; and the one
summary line per sweep. Run directories are real directories holding a config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmtrain.cli import status_select


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """runs/{lr_sweep: 3 points, lr_warmup: 2, base: 1}, and a stray directory that is no run."""
    runs = tmp_path / "runs"
    for name, n in (("lr_sweep", 3), ("lr_warmup", 2), ("base", 1)):
        for i in range(n):
            run = runs / name / f"fp{i}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(f"name: {name}\n")
            lr = [1e-3, 3e-3, 1e-2][i]
            (run / "overrides.yaml").write_text(
                f"- name={name}\n- optim.lr={lr}\n- data.seed=1\n- runs_root={runs}\n"
            )
    (runs / "notes").mkdir()
    (runs / ".sweeps" / "x" / "fp").mkdir(parents=True)  # hidden: never a name
    return runs


def _names(paths: list[Path]) -> list[str]:
    return sorted(f"{p.parent.name}/{p.name}" for p in paths)


def test_a_name_directory_a_bare_name_a_glob_and_a_run(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root.parent)
    sweep = ["lr_sweep/fp0", "lr_sweep/fp1", "lr_sweep/fp2"]
    assert _names(status_select.select(["runs/lr_sweep"], root)[0]) == sweep  # runs/NAME
    assert (
        _names(status_select.select(["lr_sweep"], root)[0]) == sweep
    )  # a name under the runs root
    found, missing = status_select.select(["lr_*"], root)  # a glob, tried under the runs root
    assert len(found) == 5 and not missing
    assert _names(status_select.select(["runs/*/fp1"], root)[0]) == [
        "lr_sweep/fp1",
        "lr_warmup/fp1",
    ]
    assert _names(status_select.select([str(root / "base" / "fp0")], root)[0]) == ["base/fp0"]
    assert (
        len(status_select.select([], root)[0]) == 6
    )  # the whole root, no stray or hidden directory
    assert (
        len(status_select.select(["runs/lr_sweep", "lr_sweep/fp0"], root)[0]) == 3
    )  # each run once
    assert status_select.select(["nope", "runs/notes"], root) == ([], ["nope", "runs/notes"])


def test_state_words_and_failed() -> None:
    assert status_select.wanted(["failed,running", " new "]) == {"failed", "running", "new"}
    stopped = {"state": "stopped: crash", "class": "crash"}
    assert status_select.matches(stopped, {"stopped"}) and status_select.matches(
        stopped, {"failed"}
    )
    assert not status_select.matches({"state": "stopped: by you (Ctrl-C)"}, {"failed"})
    assert status_select.matches({"state": "unknown: squeue timed out"}, {"unknown"})
    assert not status_select.matches({"state": "running"}, {"finished", "failed"})
    assert status_select.matches({"state": "blocked: smoke failed", "class": "crash"}, {"failed"})


def test_one_summary_line_per_sweep_with_the_best_point(root: Path) -> None:
    rows = [
        {"run": str(root / "lr_sweep/fp0"), "state": "finished", "valid_loss": 2.9},
        {"run": str(root / "lr_sweep/fp1"), "state": "stopped: diverged", "class": "diverged"},
        {"run": str(root / "lr_sweep/fp2"), "state": "finished", "valid_loss": 2.5},
        {"run": str(root / "lr_warmup/fp0"), "state": "running", "valid_loss": float("nan")},
        {"run": str(root / "lr_warmup/fp1"), "state": "new"},
        {"run": str(root / "base/fp0"), "state": "finished", "valid_loss": 1.0},  # no sweep
    ]
    assert status_select.sweep_lines(rows) == [
        "sweep lr_sweep: 3 points: 2 finished, 1 stopped (diverged 1); "
        "best valid_loss 2.5000: optim.lr=0.01 data.seed=1 (fp2)",
        "sweep lr_warmup: 2 points: 1 new, 1 running; no valid_loss yet",
    ]
    status_select.add_swept(rows)
    assert rows[0]["swept"] == ["optim.lr=0.001"] and rows[5]["swept"] == []
