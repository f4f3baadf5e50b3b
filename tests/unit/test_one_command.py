"""Issue #36, Build 1 "One command": `slurmtrain [KEY=VALUE ...]` trains, `slurmtrain COMMAND ...`
runs a command (status, logs, report, doctor, ...), and every command that takes a run reads a run
directory, a run name or a glob the same way (cli/run_arg.py).

Findings reproduced (before this change): `slurmtrain status` failed in Hydra ("Error parsing
override 'status'"); `python -m slurmtrain.cli --help` printed one usage line and exited 2; README's
`slurmtrain doctor --container KIND --image IMAGE` was "unrecognized arguments" (Hydra's parser);
`logs` and `report` needed the full run directory while `export NAME` took a name."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from slurmtrain.__main__ import main
from slurmtrain.cli import doctor, logs, report, run_arg
from slurmtrain.cli.__main__ import COMMANDS, EXAMPLES, dispatch, overview
from tests.conftest import run_cli
from tests.unit.test_report import make_run


def _slurmtrain(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """`slurmtrain ARGS` in-process (the console script's entry point); its exit code."""
    monkeypatch.setattr(sys, "argv", ["slurmtrain", *args])
    with pytest.raises(SystemExit) as done:
        main()
    return int(done.value.code or 0)


def _run(root: Path, name: str, fingerprint: str, log_line: str = "hello from rank 0") -> Path:
    """A minimal run directory: config.yaml (what makes it a run) and one rank log."""
    run = root / name / fingerprint
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text(f"name: {name}\n")
    (run / "logs" / "7_0.out").write_text(f"{log_line}\n")
    return run


def test_slurmtrain_status_is_a_command_not_an_override(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(tmp_path / "runs"))
    assert _slurmtrain(monkeypatch, "status") == 0  # before: "Error parsing override 'status'"
    assert "status: no runs under" in capsys.readouterr().out


def test_status_takes_a_name_or_glob_and_runs_root(tmp_path, monkeypatch, capsys) -> None:
    root = tmp_path / "elsewhere"
    _run(root, "licenses", "3f2a9c1e77b0")
    for arg in ("licenses", "lic*"):
        assert _slurmtrain(monkeypatch, "status", arg, "--runs-root", str(root), "--json") == 0
        assert '"name": "licenses"' in capsys.readouterr().out, arg


def test_help_lists_every_command_and_where_the_config_help_is(monkeypatch, capsys) -> None:
    assert _slurmtrain(monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"slurmtrain {name} " in out
    assert "slurmtrain [KEY=VALUE ...]" in out and "--cfg job" in out and "--help" in out
    assert dispatch(["--help"]) == 0 and capsys.readouterr().out == overview() + "\n"


def test_python_m_slurmtrain_cli_still_works_and_its_help_exits_0(tmp_path) -> None:
    """Before: one usage line, exit 2. Two short subprocesses: the alias and the training form's
    Hydra help (a training override beside --help still reaches Hydra's help page)."""
    cli = run_cli(["--help"], tmp_path, module="slurmtrain.cli", timeout=60)
    assert cli.returncode == 0 and "slurmtrain plan-table" in cli.stdout, cli.stderr
    hydra = run_cli(["name=x", "--help"], tmp_path, timeout=60)
    assert hydra.returncode == 0 and "== Config groups" in hydra.stdout, hydra.stderr


def test_every_command_has_help_with_an_example(monkeypatch, capsys) -> None:
    for name in COMMANDS:
        if name in EXAMPLES:  # export/sample: parsers in compute/ (torch); example added here
            assert EXAMPLES[name].startswith(f"example: slurmtrain {name} ")
            continue
        assert _slurmtrain(monkeypatch, name, "--help") == 0
        out = capsys.readouterr().out
        assert f"usage: slurmtrain {name}" in out and f"example: slurmtrain {name} " in out


def test_doctor_takes_readmes_container_and_image(monkeypatch) -> None:
    """README: `slurmtrain doctor --container KIND --image IMAGE` (before: Hydra's "unrecognized
    arguments"). The checks themselves are test_doctor.py's: here, what reaches doctor."""
    seen: list[list[str]] = []
    monkeypatch.setattr(doctor, "main", lambda argv: seen.append(list(argv)) or 0)
    args = ["doctor", "--container", "apptainer", "--image", "/img.sif"]
    assert _slurmtrain(monkeypatch, *args) == 0
    assert seen == [args[1:]]
    parsed = doctor.build_parser().parse_args(seen[0])
    assert (parsed.container, parsed.image) == ("apptainer", "/img.sif")


def test_logs_takes_a_name_a_glob_or_a_directory(tmp_path, monkeypatch, capsys) -> None:
    root = tmp_path / "runs"
    run = _run(root, "licenses", "3f2a9c1e77b0")
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(root))
    for arg in ("licenses", "lic*", str(run), str(root / "licenses")):
        assert _slurmtrain(monkeypatch, "logs", arg) == 0, arg
        assert "hello from rank 0" in capsys.readouterr().out, arg


def test_a_name_of_several_runs_reads_the_newest_and_says_so(tmp_path, capsys) -> None:
    root = tmp_path / "runs"
    old = _run(root, "sweep", "aaaaaaaaaaaa", "old run")
    new = _run(root, "sweep", "bbbbbbbbbbbb", "new run")
    past = time.time() - 3600
    os.utime(old, (past, past))
    assert run_arg.resolve("sweep", root) == ([new.resolve(), old.resolve()], root)
    assert logs.main(["sweep", "--runs-root", str(root)]) == 0
    captured = capsys.readouterr()
    assert "new run" in captured.out and "old run" not in captured.out
    assert "'sweep' names 2 runs; reading the newest" in captured.err


def test_a_run_that_is_not_there_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(tmp_path))
    assert _slurmtrain(monkeypatch, "logs", "nosuchrun") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("slurmtrain logs: RUN='nosuchrun': no run directory there")
    assert len(err.splitlines()) == 1
    assert _slurmtrain(monkeypatch, "stauts") == 2  # a word no override can be: not Hydra's error
    assert "unknown command 'stauts'; one of: status, logs" in capsys.readouterr().err


def test_report_takes_a_name(tmp_path, monkeypatch, capsys) -> None:
    root = tmp_path / "runs"
    run = make_run(root / "demo" / "3f2a9c1e77b0")
    (run / "config.yaml").write_text("name: demo\n")
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(root))
    assert report.main(["demo", "--out", str(tmp_path / "r.png")]) == 0
    assert "attempts  3" in capsys.readouterr().out and (tmp_path / "r.png").is_file()


def test_export_and_sample_get_the_run_directory_a_name_or_glob_names(tmp_path, monkeypatch):
    """compute/ reads a directory or a name: the dispatcher hands it the directory a glob or a
    name directory names; an export folder (sample) and an option pass as given."""
    from slurmtrain.cli.__main__ import _run_first

    root = tmp_path / "runs"
    run = _run(root, "licenses", "3f2a9c1e77b0")
    monkeypatch.setenv("SLURMTRAIN_RUNS_ROOT", str(root))
    assert _run_first("export", ["lic*", "--out", "x"]) == [str(run.resolve()), "--out", "x"]
    exported = tmp_path / "exports" / "licenses"
    exported.mkdir(parents=True)
    (exported / "config.json").write_text("{}")
    assert _run_first("sample", [str(exported), "--prompt", "a"])[0] == str(exported)
    assert _run_first("sample", ["--prompt", "a", "licenses"])[0] == "--prompt"
    assert _run_first("status", ["lic*"]) == ["lic*"]
