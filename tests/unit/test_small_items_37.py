"""Issue 37, build 6 (the smaller items), each reproduced on the code before it, then fixed:
container images checked at login, OCI binds read-only where the job only reads, and CPU plans
whose memory is absurd refused like any plan that does not fit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.errors import EXIT_CONFIG, ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.common.validation_container import check_image_file
from slurmtrain.login import container, slurm_submit
from slurmtrain.login.prepare import resolve
from slurmtrain.planning import host_memory, preflight
from tests.conftest import slurmtrain_env
from tests.plans import planned

SIF_HEAD = b"#!/usr/bin/env run-singularity\n".ljust(32) + b"SIF_MAGIC\0" + b"01\0"
SQSH_HEAD = b"hsqs" + b"\0" * 92


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config", overrides=["cluster=slurm", f"runs_root={tmp_path}/runs", *overrides]
        )
    return resolve(cfg)


def _image(path, head: bytes):
    path.write_bytes(head + b"\0" * 4096)
    return path


def test_a_missing_apptainer_image_is_refused_at_login_not_queued(tmp_path):
    """It rendered, was queued and ended as `config_error: exit code 2` with no word about
    apptainer; now the config's validation (dry run and submission alike, before the run
    directory is made) refuses it in one line."""
    missing = tmp_path / "train.sif"
    overrides = ("cluster.container=apptainer", f"cluster.image={missing}")
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, *overrides)
    line = str(err.value)
    assert line.startswith(f"cluster.image={missing}: no such file or directory (apptainer "), line
    assert "apptainer build" in line and "\n" not in line
    assert not (tmp_path / "runs").exists()
    _image(missing, SIF_HEAD)
    cfg = _cfg(tmp_path, *overrides)
    assert str(missing) in slurm_submit.render_sbatch(cfg, locate(cfg))


def test_a_missing_pyxis_squashfs_is_refused_a_registry_image_is_not_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster.image=\S+/app.sqsh: no such file .*enroot"):
        _cfg(tmp_path, "cluster.container=pyxis", f"cluster.image={tmp_path}/app.sqsh")
    sqsh = _image(tmp_path / "app.sqsh", SQSH_HEAD)
    for image in (str(sqsh), "nvcr.io#nvidia/pytorch:24.05-py3", "ubuntu:22.04"):
        cfg = _cfg(tmp_path, "cluster.container=pyxis", f"cluster.image='{image}'")
        assert f"--container-image={image}" in container.pyxis_args(cfg)


@pytest.mark.parametrize(
    "kind, name, head, why",
    [
        ("apptainer", "empty.sif", b"", "an empty file, not an image apptainer runs"),
        (
            "apptainer",
            "text.sif",
            b"hello\n" * 40,
            "not an image apptainer runs (no SIF or squashfs",
        ),
        ("pyxis", "train.sif", SIF_HEAD, "not an image pyxis runs (no squashfs header"),
        ("pyxis", "dir.sqsh", None, "not a regular file (pyxis image)"),
    ],
)
def test_an_image_of_the_wrong_kind_is_refused_in_one_line(tmp_path, kind, name, head, why):
    path = tmp_path / name
    if head is None:
        path.mkdir()
    else:
        path.write_bytes(head)
    with pytest.raises(ConfigError) as err:
        check_image_file(kind, str(path))
    assert str(err.value).startswith(f"cluster.image={path}: {why}"), err.value


def test_every_kind_apptainer_runs_is_accepted(tmp_path):
    check_image_file("apptainer", str(_image(tmp_path / "a.sif", SIF_HEAD)))
    check_image_file("apptainer", str(_image(tmp_path / "old.img", SQSH_HEAD)))
    check_image_file("apptainer", str(tmp_path))  # a sandbox directory
    for uri in ("docker://ubuntu:22.04", "library://lolcow", "oras://ghcr.io/x:1",
                "docker-archive:/tmp/x.tar"):  # fmt: skip
        check_image_file("apptainer", uri)  # pulled on the node: nothing to read here
    check_image_file("apptainer", "/no-such-filesystem-here/images/a.sif")  # not mounted here


def test_oci_bundles_bind_the_hosts_configuration_read_only(tmp_path):
    """tools/oci_spec.py's bundles bound /etc/slurm and /run/munge read-write: root in the
    host's namespaces could rewrite the host's slurm.conf. The runs root stays writable."""
    image = {"root": {"path": "/r"}, "mounts": [
        {"destination": path, "type": "bind", "source": path, "options": ["rbind"]}
        for path in ("/etc/slurm", "/run/munge", "/scratch")
    ] + [{"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts",
          "options": ["rbind", "rw"]}]}  # fmt: skip
    cfg = _cfg(tmp_path, "cluster.container_binds=[/data]")
    mounts = {m["destination"]: m["options"] for m in container.run_bundle(cfg, image)["mounts"]}
    for path in ("/etc/slurm", "/run/munge", "/etc/hosts"):
        assert mounts[path] == ["rbind", "ro"], mounts
    assert mounts["/scratch"] == ["rbind"]  # the image's own other binds: as it has them
    runs = str((tmp_path / "runs").resolve())
    assert mounts[runs] == mounts["/dev/shm"] == mounts["/data"] == ["rbind", "rw"]


@pytest.mark.usefixtures("no_slurm")
def test_an_absurd_cpu_plan_is_refused_naming_the_key_the_value_and_the_fix(tmp_path):
    """train.micro_batch_size=100000000 planned 173 TiB per rank with exit 0 (no GPU memory to
    compare with): the local ranks run on this machine, so its RAM is the bound."""
    cfg = planned(tmp_path, "cluster=local", "gpus_per_node=0", "train.micro_batch_size=100000000")
    report = preflight.report(cfg)
    ram, source = host_memory.node_memory("local", None)
    assert ram and source == "this machine's RAM"
    assert report.misfit is not None, report.text
    assert report.misfit.startswith("plan does not fit: train.micro_batch_size=100000000: "), (
        report.misfit
    )
    assert "TiB x 2 CPU ranks" in report.misfit and "set train.micro_batch_size=" in report.misfit
    fits = int(report.misfit.split("set train.micro_batch_size=")[1].split()[0])
    small = planned(tmp_path, "cluster=local", "gpus_per_node=0", f"train.micro_batch_size={fits}")
    assert preflight.report(small).misfit is None  # the number it names does fit
    default = planned(tmp_path, "cluster=local", "gpus_per_node=0")
    assert preflight.report(default).misfit is None


@pytest.mark.usefixtures("no_slurm")
def test_cpu_mem_gb_bounds_a_cpu_plan_anywhere_and_a_model_too_big_names_no_micro_batch(tmp_path):
    big = planned(tmp_path, "cluster=local", "gpus_per_node=0", "model=opt13b",
                  "cluster.cpu_mem_gb=8")  # fmt: skip
    misfit = preflight.report(big).misfit or ""
    assert "> 8.0 GiB (cluster.cpu_mem_gb=8); use a smaller model" in misfit, misfit
    assert host_memory.node_memory("slurm", None) == (None, "")  # unknown: nothing refused


def test_the_dry_run_of_an_absurd_plan_exits_2_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "slurmtrain", "cluster=local", "gpus_per_node=0",
         "train.micro_batch_size=100000000", "dry_run=true", f"runs_root={tmp_path}"],
        capture_output=True, text=True, env=slurmtrain_env(), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("slurmtrain: error:")]
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert len(errors) == 1 and "train.micro_batch_size=100000000" in errors[0], done.stderr
