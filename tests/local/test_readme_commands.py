"""README "From raw text to a model": its commands, extracted from the README, run as written
(prepare -> train -> watch -> sample -> export -> load in transformers), each exiting 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, slurmtrain_env

HEADING = "## From raw text to a model"


def readme_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_section_has_the_five_steps_in_order():
    cmds = readme_commands()
    order = [
        "prepare_data.py",
        "python -m slurmtrain ",
        "slurmtrain report",
        "slurmtrain sample",
        "slurmtrain export",
    ]
    positions = [next(i for i, c in enumerate(cmds) if key in c) for key in order]
    assert positions == sorted(positions)
    assert "from_pretrained" in cmds[-1]


def test_readme_commands_run_as_written(tmp_path):
    # A clean checkout's view: the repository's tools/ beside an empty working directory, `python`
    # the interpreter running the tests (the set-up .venv).
    (tmp_path / "tools").symlink_to(ROOT / "tools")
    env = slurmtrain_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    env.pop("SLURMTRAIN_RUNS_ROOT", None)
    outputs = []
    for cmd in readme_commands():
        done = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "OPTForCausalLM" in outputs[-1]
    assert (tmp_path / "exports" / "licenses" / "config.json").is_file()
    status = outputs[
        [i for i, c in enumerate(readme_commands()) if c.startswith("slurmtrain status")][0]
    ]
    assert "valid_loss" in status and "licenses" in status and "finished" in status
    sample = outputs[
        [i for i, c in enumerate(readme_commands()) if c.startswith("slurmtrain sample")][0]
    ]
    assert sample.startswith("The GNU General Public License") and len(sample.strip()) > 40
