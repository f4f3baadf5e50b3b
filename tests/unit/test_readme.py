"""The README is for a cluster user (issue 36, Build 5): short, its code fits a terminal, root only
for a fresh machine's set-up, its figures those of the code, every command one a test runs, and the
contributors' material in docs/ where the README points."""

from __future__ import annotations

import re

import tomllib

from tests.conftest import ROOT
from tests.readme import README, commands, sections

SETUP = [
    "bash tools/demo.sh     # set-up (.venv, pip) + 2 local workers train a small OPT, then print a sample",
    "bash tools/test.sh     # set-up + Debian's Slurm/munge/slurmdbd, a local 4-node cluster, every test",
]


def test_short_and_every_code_line_fits_a_terminal():
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    code = [
        line
        for block in re.findall(r"(?ms)^```\w*\n(.*?)^```", text)
        for line in block.splitlines()
    ]
    assert code and not [line for line in code if len(line) > 120]


def test_the_fresh_machine_set_up_is_the_only_place_root_is_named():
    """The two commands CI runs (.ci/run -> tools/test.sh) stay as they are, and "as root" appears
    in their set-up line only."""
    quick = sections()["Quick start"]
    assert commands(quick) == SETUP
    assert "tools/test.sh" in (ROOT / ".ci" / "run").read_text()
    rooted = [line for line in README.read_text().splitlines() if "as root" in line]
    assert len(rooted) == 1 and rooted[0] in quick and "fresh Debian 12" in rooted[0]


def test_every_command_is_one_a_test_runs():
    """Every block sits under a heading whose commands tests/local run (test_readme_commands: all
    but these three, which it names) and every command is one a user types from any directory."""
    owners = {
        "Quick start": "tools/test.sh",  # CI
        "Install on a cluster": "tests/local/test_wheel.py",
        "Your own model": "tests/local/test_model_families.py",
    }
    readme_test = (ROOT / "tests/local/test_readme_commands.py").read_text()
    for heading, runner in owners.items():
        assert heading in readme_test and (ROOT / runner).is_file()
        if runner.endswith(".py"):
            assert f'"{heading}"' in (ROOT / runner).read_text(), runner
    firsts = set()
    for text in sections().values():
        for cmd in commands(text):
            words = [w for w in cmd.split() if not re.match(r"^[A-Z_]+=", w)]
            firsts.add(words[0])
            assert "tools/prepare_data" not in cmd and "python -m slurmtrain" not in cmd, cmd
    assert firsts == {"bash", "python3", "~/st/bin/pip", "export", "slurmtrain", "python"}


def test_the_wheel_it_installs_is_the_one_this_version_builds():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    install = commands(sections()["Install on a cluster"])
    assert f"slurmtrain-{version}-py3-none-any.whl" in install[1]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    named = re.search(r"Optional extras: (.*?) \(trackers\) and `(\w+)`", README.read_text(), re.S)
    assert named, "the extras sentence"
    assert set(re.findall(r"`(\w+)`", named.group(1))) | {named.group(2)} == set(extras) - {"test"}


def test_its_figures_are_the_codes():
    """The modes the security section names: the run directory's default and secrets.env's."""
    from slurmtrain.common import errors, ownership, schema

    text = sections()["Shared cluster and security"]
    assert len(text.strip().splitlines()) <= 12
    assert f"`run_dir_mode` ({schema.RootConfig.run_dir_mode})" in text
    assert int(schema.RootConfig.run_dir_mode, 8) == ownership.DEFAULT_MODE
    assert "secrets.env`, mode 0600" in text
    assert "mode=0o600, exact_mode=True" in (ROOT / "slurmtrain/common/secrets.py").read_text()
    # no other figure in prose outside commands and tables: numbers belong to the plan's output
    prose = re.sub(r"(?ms)^```.*?^```", "", README.read_text())
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("|"))
    prose = re.sub(r"`[^`]*`", "", prose)  # keys and commands
    prose = re.sub(r"\[[^]]*\]\([^)]*\)", "", prose)  # links
    figures = set(re.findall(r"(?<![\w.-])\d+(?:[.,]\d+)*(?![\w-])", prose))
    assert errors.EXIT_CONFIG == 2 and "exit code 2" in prose  # bad input's exit code
    assert figures == {"12", "3.11", "0700", "0600", "2"}, figures  # and Debian 12, Python 3.11


def test_the_docs_it_points_to_exist_and_the_memory_table_is_the_plans(capsys):
    linked = set(re.findall(r"\]\((docs/[\w.]+)\)", README.read_text()))
    assert linked and all((ROOT / path).is_file() for path in linked)
    assert linked == {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    from slurmtrain.cli.plan_table import main

    assert main(["--markdown"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert "\n".join(table) in (ROOT / "docs" / "models.md").read_text(), (
        "docs/models.md's memory table differs from `slurmtrain plan-table --markdown`; paste it"
    )
