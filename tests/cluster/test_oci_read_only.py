"""The run's OCI bundle binds the host's configuration read-only (issue 37, build 6): root inside
the container, in the host's namespaces, wrote the host's /etc/slurm through the image's
read-write bind. Run with runc itself on the cached image (no Slurm step: seconds); the runs root
stays writable and munge's socket still connects on a read-only bind."""

from __future__ import annotations

import json
import subprocess

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.login import container
from slurmtrain.login.prepare import resolve
from tests.cluster.test_containers import oci_image  # noqa: F401  the cached bundle (fixture)

pytestmark = pytest.mark.slurm
schema.register()
PROBE = """
import os, socket
for path in ("/etc/slurm/planted-by-a-job", os.environ["RUNS"] + "/written"):
    try:
        open(path, "w").close()
        print("wrote", path)
    except OSError as err:
        print("refused", path, err.strerror)
s = socket.socket(socket.AF_UNIX)
s.connect("/run/munge/munge.socket.2")
print("munge connects")
"""


def test_the_job_cannot_write_the_hosts_slurm_config(oci_image, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")
    runs = tmp_path / "runs"
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = resolve(compose("config", overrides=[
            "cluster=slurm", f"runs_root={runs}", "cluster.container=oci",
            f"cluster.image={oci_image}"]))  # fmt: skip
    spec = container.run_bundle(cfg, container.check_image(cfg))
    spec["process"]["args"] = ["python3", "-c", PROBE]
    spec["process"]["env"] = [*spec["process"].get("env", []), f"RUNS={runs.resolve()}"]
    runs.mkdir()
    (tmp_path / "config.json").write_text(json.dumps(spec))
    done = subprocess.run(
        ["runc", f"--root={tmp_path / 'state'}", "run", "-b", str(tmp_path), f"st37-{tmp_path.name}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "refused /etc/slurm/planted-by-a-job Read-only file system" in out, out
    assert f"wrote {runs.resolve()}/written" in out and "munge connects" in out, out
