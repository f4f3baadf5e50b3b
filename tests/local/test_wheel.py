"""An installed wheel (not only an editable checkout) still finds its packaged conf/."""

from __future__ import annotations

import site
import subprocess
import sys
import venv

from tests.conftest import ROOT


def test_wheel_in_a_fresh_venv_composes_from_another_directory(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                            "--outdir", str(dist), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = dist.glob("slurmtrain-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Dependencies come from the test's own environment (offline); the package itself from the wheel.
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if p.endswith("site-packages")]
    (tmp_path / "venv" / purelib.split(str(env_dir) + "/", 1)[1]).joinpath("deps.pth") \
        .write_text("\n".join(deps) + "\n")
    installed = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([python, "-c", "import slurmtrain; print(slurmtrain.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True)
    assert where.stdout.startswith(str(env_dir)), where.stdout + where.stderr
    done = subprocess.run([python, "-m", "slurmtrain", "model=opt125m", "dry_run=true"],
                          cwd=elsewhere, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "num_layers: 12" in done.stdout and "plan:" in done.stdout
