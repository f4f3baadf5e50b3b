"""The three container runtimes as text: Slurm's OCI (--container), pyxis and Apptainer.

The ranks' step runs the image's Python; the supervisor runs with the batch shell's Python when
that can import slurmtrain, else inside the image as a one-task step (never silently skipped).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.login import container, slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config", overrides=["cluster=slurm", f"runs_root={tmp_path}/runs", *overrides]
        )
    return resolve(cfg)


def _bundle(tmp_path, python=True, mounts=True):
    """A minimal OCI bundle: config.json (mounting the runs root, or not) and a rootfs with (or
    without) /usr/bin/python3."""
    bundle = tmp_path / "image"
    (bundle / "rootfs/usr/bin").mkdir(parents=True)
    if python:
        exe = bundle / "rootfs/usr/bin/python3.11"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        (bundle / "rootfs/usr/bin/python3").symlink_to("python3.11")
    runs = str(tmp_path.resolve())
    bind = {"destination": runs, "type": "bind", "source": runs, "options": ["rbind", "rw"]}
    spec = {"root": {"path": "rootfs"}, "mounts": [bind] if mounts else [], "process": {}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def _rank_line(text: str) -> list[str]:
    line = next(ln.strip() for ln in text.splitlines() if "slurmtrain.compute.attempt" in ln)
    return shlex.split(line.removesuffix(" &"))


def test_oci_ranks_each_run_runc_on_the_runs_bundle_with_the_images_python(tmp_path):
    image = _bundle(tmp_path, mounts=False)
    cfg = _cfg(tmp_path, "cluster.container=oci", f"cluster.image={image}")
    run = locate(cfg)
    text = slurm_submit.render_sbatch(cfg, run)
    argv = _rank_line(text)
    assert argv[-9:] == ["bash", "-c", "$oci_task", "oci-task", "python3", "-u", "-m",
                         "slurmtrain.compute.attempt", str(run.path)]  # fmt: skip
    assert f"export SLURMTRAIN_OCI_CONFIG={run.path}/oci/config.json" in text
    assert 'runc --root=/run/slurmtrain-runc run -b "$d"' in text

    container.write_bundle(cfg, run.path)
    spec = json.loads((run.path / "oci/config.json").read_text())
    assert spec["root"]["path"] == str(image.resolve() / "rootfs")
    assert spec["process"]["args"] == ["/bin/bash", "@TASK_DIR@/run"]
    runs_root = str((tmp_path / "runs").resolve())
    for path in (runs_root, "/dev/shm"):
        assert {"destination": path, "type": "bind", "source": path,
                "options": ["rbind", "rw"]} in spec["mounts"]  # fmt: skip


def test_supervisor_runs_on_the_host_else_inside_the_image(tmp_path):
    image = _bundle(tmp_path)
    cfg = _cfg(
        tmp_path,
        "cluster.container=oci",
        f"cluster.image={image}",
        "cluster.host_python=/usr/bin/python3",
    )
    run = locate(cfg)
    text = slurm_submit.render_sbatch(cfg, run)
    assert "if /usr/bin/python3 -c 'import slurmtrain.batch.supervise'" in text
    inside = next(ln for ln in text.splitlines() if "supervise() { srun" in ln)
    assert "--nodes=1 --ntasks=1 --overlap" in inside
    assert 'bash -c "$oci_task" oci-task python3 -m' in inside
    # every supervisor call goes through the one function that knows where it runs
    assert not re.search(r"python3? -m slurmtrain\.batch\.supervise ", text)
    assert "supervise supervise" in text


def test_pyxis_and_apptainer_supervisor_steps_as_text(tmp_path):
    pyx = _cfg(
        tmp_path, "cluster.container=pyxis", "cluster.image='nvcr.io#nvidia/pytorch:24.05-py3'"
    )
    inside = next(
        ln
        for ln in slurm_submit.render_sbatch(pyx, locate(pyx)).splitlines()
        if "supervise() { srun" in ln
    )
    assert (
        f"'--container-image=nvcr.io#nvidia/pytorch:24.05-py3' "
        f"--container-mounts={tmp_path}/runs:{tmp_path}/runs python -m" in inside
    )
    app = _cfg(tmp_path, "cluster.container=apptainer", "cluster.image=/images/train.sif")
    inside = next(
        ln
        for ln in slurm_submit.render_sbatch(app, locate(app)).splitlines()
        if "supervise() { srun" in ln
    )
    assert f"apptainer exec --nv --bind {tmp_path}/runs /images/train.sif python -m" in inside
    bare = _cfg(tmp_path)
    assert "supervise() { srun" not in slurm_submit.render_sbatch(bare, locate(bare))


def test_an_image_without_python_is_refused_in_one_line(tmp_path):
    image = _bundle(tmp_path, python=False)
    cfg = _cfg(tmp_path, "cluster.container=oci", f"cluster.image={image}")
    with pytest.raises(ConfigError) as err:
        slurm_submit.render_sbatch(cfg, locate(cfg))
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"cluster.image={image}: the image has no python3")
    assert "tools/build_image.sh" in text

    missing = _cfg(tmp_path, "cluster.container=oci", f"cluster.image={tmp_path}/nothing")
    with pytest.raises(ConfigError, match=r"cluster.image=.*not an OCI bundle"):
        slurm_submit.render_sbatch(missing, locate(missing))


def test_doctor_reads_an_oci_image_before_anything_is_queued(tmp_path):
    from slurmtrain.cli.doctor.image_checks import check_image

    image = _bundle(tmp_path)
    site = image / "rootfs/usr/local/lib/python3.11/dist-packages"
    (site / "torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    (site / "torch-2.13.0+cpu.dist-info/WHEEL").write_text(
        "Tag: cp311-cp311-manylinux_2_28_x86_64\n"
    )
    (site / "torch").mkdir()
    (site / "torch/version.py").write_text(
        "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"
    )
    libc = image / "rootfs/usr/lib/x86_64-linux-gnu/libc.so.6"
    libc.parent.mkdir(parents=True)
    libc.write_bytes(b"\0GLIBC_2.17\0GLIBC_2.36\0")
    ok = check_image("oci", str(image), 5)
    assert ok.status == "ok" and "torch 2.13.0+cpu" in ok.value and "GLIBC 2.36" in ok.value
    libc.write_bytes(b"\0GLIBC_2.17\0")
    old = check_image("oci", str(image), 5)
    assert old.status == "fail" and "2.28 that its torch wheel needs" in old.value
    (image / "rootfs/usr/bin/python3").unlink()
    assert "has no python3" in check_image("oci", str(image), 5).value


@pytest.mark.parametrize("kind", ["none", "oci"])
def test_the_rendered_script_is_valid_bash(tmp_path, kind):
    import subprocess

    extra = ["cluster.container=oci", f"cluster.image={_bundle(tmp_path)}"] if kind == "oci" else []
    cfg = _cfg(tmp_path, *extra)
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_submit.render_sbatch(cfg, locate(cfg)))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
