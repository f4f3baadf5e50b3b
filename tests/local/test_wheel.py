"""Wheel, editable install and console script compose the same config from any directory."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, dry_run_file


def test_wheel_in_a_fresh_venv_composes_from_another_directory(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = dist.glob("slurmtrain-*.whl")

    # The README's install, as written, in the folder holding the wheel: its venv under a home of
    # its own; pip offline and without dependencies (they come from the test's own environment
    # through a .pth file), so only the package comes from the wheel.
    from tests.readme import section_commands

    install = section_commands("Install on a cluster")
    assert install[0].startswith("python3 -m venv ~/st") and wheel.name in install[1], install
    home = tmp_path / "home"
    home.mkdir()
    shell = dict(os.environ, HOME=str(home), PIP_NO_INDEX="1", PIP_NO_DEPS="1")
    shell["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    shell.pop("PYTHONPATH", None)
    made = subprocess.run(["bash", "-c", install[0]], cwd=dist, env=shell, capture_output=True)
    assert made.returncode == 0, made.stderr
    env_dir = home / "st"
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = [p for p in site.getsitepackages() if p.endswith("site-packages")]
    Path(purelib, "deps.pth").write_text("\n".join(deps) + "\n")
    script = "set -e\n" + "\n".join(install[1:])
    installed = subprocess.run(
        ["bash", "-c", script], cwd=dist, env=shell, capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    assert "slurmtrain status" in installed.stdout  # its last line: slurmtrain --help

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [python, "-c", "import slurmtrain; print(slurmtrain.__file__)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(env_dir)), where.stdout + where.stderr
    done = subprocess.run(
        [python, "-m", "slurmtrain", "model=opt125m", "dry_run=true"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "num_layers: 12" in dry_run_file(done.stdout).read_text() and "plan:" in done.stdout

    # The console script of the wheel, as the README advertises it.
    script = env_dir / "bin" / "slurmtrain"
    mission = ["model=opt13b", "nodes=64", "gpus_per_node=8", "cluster=slurm", "dry_run=true"]
    done = subprocess.run([str(script), *mission], cwd=elsewhere, capture_output=True, text=True)
    assert _planned_or_refused_by_this_cluster(done), done.stderr
    assert "num_layers: 40" in dry_run_file(done.stdout).read_text(), done.stdout
    assert "64 nodes x 8 GPUs = 512 ranks" in done.stdout, done.stdout
    overview = subprocess.run(
        [str(script), "--help"], cwd=elsewhere, capture_output=True, text=True
    )
    assert "slurmtrain status" in overview.stdout, overview.stdout  # the commands, both forms
    # Hydra's help page (the config groups), as the overview says to ask for it
    helped = subprocess.run(
        [str(script), "model=opt125m", "--help"], cwd=elsewhere, capture_output=True, text=True
    )
    assert helped.stdout.startswith("slurmtrain: large-model training on Slurm"), helped.stdout
    # the wheel's packaged conf/: every model group option is listed, the families too
    [models] = [line for line in helped.stdout.splitlines() if line.startswith("model: ")]
    assert {"opt125m", "opt13b", "llama_tiny", "qwen2_tiny", "hf"} <= set(models[7:].split(", "))


def test_editable_install_and_its_console_script_compose_from_another_directory(tmp_path):
    """The project's own venv holds an editable install: conf/ is mapped from the repository root."""
    script = ROOT / ".venv" / "bin" / "slurmtrain"
    mission = ["model=opt13b", "nodes=64", "gpus_per_node=8", "cluster=slurm", "dry_run=true"]
    for argv in ([sys.executable, "-m", "slurmtrain", *mission], [str(script), *mission]):
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert _planned_or_refused_by_this_cluster(done), done.stderr
        assert "num_layers: 40" in dry_run_file(done.stdout).read_text(), done.stdout
        assert "64 nodes x 8 GPUs = 512 ranks" in done.stdout, done.stdout
    conf = subprocess.run(
        [sys.executable, "-c", "from slurmtrain.common.schema import conf_dir; print(conf_dir())"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert conf.stdout.strip() == str(ROOT / "conf"), conf.stdout + conf.stderr


def _planned_or_refused_by_this_cluster(done: subprocess.CompletedProcess) -> bool:
    """The dry run composed and planned; it exits 2 only where this machine's test cluster (4
    CPU nodes) would refuse 64 nodes, as the real submission would."""
    planned = "plan: fits" in done.stdout
    return planned and (
        done.returncode == 0 or (done.returncode == 2 and "exceed partition" in done.stderr)
    )
