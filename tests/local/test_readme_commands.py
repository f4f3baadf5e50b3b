"""Every command of the README, run from a directory outside the checkout with the venv's bin/ first
on PATH, as a user who installed slurmtrain runs them.

"From raw text to a model" runs as written (prepare -> train -> watch -> sample -> export -> load in
transformers), and its run is the one the later commands look after (status, logs, report, cancel,
sync, a branch from its checkpoint). Every other training command gets `dry_run=true` appended: it
composes, validates and plans, and on Slurm asks `sbatch --test-only`. Not run here: the fresh-machine
set-up (it is what CI runs: .ci/run -> tools/test.sh), the install (tests/local/test_wheel.py runs it
on the wheel it builds) and "Your own model" (tests/local/test_model_families.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from slurmtrain.cli.__main__ import COMMANDS
from tests.conftest import ROOT, slurmtrain_env
from tests.readme import commands, section_commands, sections

RAW = "From raw text to a model"
# sections whose commands other runners own (see the module docstring)
RUN_ELSEWHERE = ("Quick start", "Install on a cluster", "Your own model")
# The test cluster's partitions are small (4 CPU nodes in the default one) and SLURMTRAIN_AUTO=off
# plans cluster=auto on this machine: a plan for more nodes is refused as its submission would be
# (exit 2, after the plan).
REFUSED_FOR_SIZE = ("exceed partition", "runs on this machine only", "sbatch --test-only refused")


def _words(cmd: str) -> list[str]:
    """The command's words after any leading VAR=value assignments."""
    words = shlex.split(cmd, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]
    return words


def as_tested(cmd: str) -> str:
    """A training command (`slurmtrain KEY=VALUE ...`, a sweep) with dry_run=true appended; any other
    command as written."""
    words = _words(cmd)
    if words[0] != "slurmtrain" or words[1] in COMMANDS or "--cfg" in words or "--help" in words:
        return cmd
    if "dry_run=true" in words:
        return cmd
    return cmd.split("  #", 1)[0].rstrip() + " dry_run=true"


def _fixtures(cwd: Path, home: Path) -> None:
    """The inputs the README's commands name that a user would have: a jsonl corpus, a folder of
    shards with another text field, an Apptainer image, a site profile in ~/st-conf."""
    rows = [{"text": f"line {i}: the quick brown fox jumps over the lazy dog"} for i in range(64)]
    (cwd / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cwd / "shards").mkdir()
    shard = "".join(json.dumps({"content": f"def f{i}(): return {i}"}) + "\n" for i in range(64))
    (cwd / "shards" / "a.jsonl").write_text(shard)
    (cwd / "train.sif").write_bytes(b"\0" * 32 + b"SIF_MAGIC")  # the header login checks
    (home / "st-conf" / "site").mkdir(parents=True)
    shutil.copy(ROOT / "conf" / "site" / "conda_modules.yaml", home / "st-conf/site/mysite.yaml")


def _env(home: Path) -> dict[str, str]:
    """A user's shell: the venv's bin/ first, no checkout on PYTHONPATH, a home of its own, and the
    secrets `cluster.secrets=[...]` names set (their values come from here, never argv)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = slurmtrain_env({"PATH": path, "HOME": str(home), "WANDB_API_KEY": "k", "HF_TOKEN": "t"})
    for name in ("SLURMTRAIN_RUNS_ROOT", "PYTHONPATH", "SLURMTRAIN_INJECT"):
        env.pop(name, None)
    return env


def _run(cmd: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def test_the_raw_text_section_has_the_steps_in_order():
    cmds = section_commands(RAW)
    order = ["slurmtrain prepare-data", "slurmtrain cluster=", "slurmtrain report"]
    order += ["slurmtrain sample", "slurmtrain export"]
    positions = [next(i for i, c in enumerate(cmds) if c.startswith(key)) for key in order]
    assert positions == sorted(positions)
    assert "from_pretrained" in cmds[-1]


def test_every_readme_command_runs_from_outside_the_checkout(tmp_path):
    cwd, home = tmp_path / "work", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    _fixtures(cwd, home)
    env = _env(home)
    outputs, timings = {}, []
    for cmd in section_commands(RAW):  # as written: the run the others read
        start = time.monotonic()
        done = _run(cmd, cwd, env)
        timings.append((time.monotonic() - start, cmd))
        assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
        outputs[cmd] = done.stdout
    assert (cwd / "exports" / "licenses" / "config.json").is_file()
    [status] = [out for cmd, out in outputs.items() if cmd == "slurmtrain status"]
    assert "valid_loss" in status and "licenses" in status and "finished" in status
    [sample] = [out for cmd, out in outputs.items() if cmd.startswith("slurmtrain sample")]
    assert sample.startswith("The GNU General Public License") and len(sample.strip()) > 40
    assert "OPTForCausalLM(" in list(outputs.values())[-1]

    others = [
        cmd
        for heading, text in sections().items()
        if not heading.startswith((RAW, *RUN_ELSEWHERE))
        for cmd in commands(text)
    ]
    assert len(others) >= 20, others  # the usage, data, trackers, secrets, failure, port blocks
    failed = []
    for cmd in others:
        tested = as_tested(cmd)
        start = time.monotonic()
        done = _run(tested, cwd, env)
        timings.append((time.monotonic() - start, tested))
        said = f"{tested}\nrc={done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        refused_for_size = done.returncode == 2 and "plan: " in done.stdout
        refused_for_size &= any(why in done.stderr for why in REFUSED_FOR_SIZE)
        failed += [] if done.returncode == 0 or refused_for_size else [said]
    for seconds, cmd in sorted(timings, reverse=True):
        print(f"{seconds:5.1f} s  {cmd}")  # -s shows where the time goes
    assert not failed, "\n\n".join(failed)
