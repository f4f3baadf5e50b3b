"""Container binds, the apptainer binary and GPU flag, runtime flags (issue 35, build 5): what the
batch script renders for each runtime, and each bad value refused at login in one line.

The finding this reproduces: pyxis flags given through cluster.srun_extra reached the ranks' srun
but the in-image supervisor's step dropped `--no-container-mount-home` (it kept only the
`--container-*` arguments), so the supervisor saw the user's home and the ranks did not.
"""

from __future__ import annotations

import shlex

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import locate
from slurmtrain.common.validation_login import check_all
from slurmtrain.login import container, slurm_submit
from slurmtrain.login.prepare import resolve

schema.register()
IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config", overrides=["cluster=slurm", f"runs_root={tmp_path}/runs", *overrides]
        )
    return resolve(cfg)


def _lines(cfg) -> tuple[list[str], list[str]]:
    """The ranks' srun argv and the in-image supervisor's srun argv."""
    text = slurm_submit.render_sbatch(cfg, locate(cfg))
    ranks = next(ln.strip() for ln in text.splitlines() if "slurmtrain.compute.attempt" in ln)
    sup = next(ln.strip() for ln in text.splitlines() if "supervise() { srun" in ln)
    sup = sup.removeprefix("supervise() {").split(' -m "slurmtrain.batch.')[0]
    return shlex.split(ranks.removesuffix(" &")), shlex.split(sup)


def _container_flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith(("--container-", "--no-container-"))]


def test_pyxis_supervisor_step_has_exactly_the_ranks_container_flags(tmp_path):
    cfg = _cfg(
        tmp_path,
        "cluster.container=pyxis",
        f"cluster.image='{IMAGE}'",
        "cluster.srun_extra=['--no-container-mount-home','--container-workdir=/work','--mpi=pmi2']",
    )
    ranks, sup = _lines(cfg)
    assert "--no-container-mount-home" in _container_flags(ranks)
    assert _container_flags(sup) == _container_flags(ranks)
    assert "--mpi=pmi2" in ranks and "--mpi=pmi2" not in sup  # not a container flag


def test_pyxis_binds_and_flags_in_one_mounts_list_quoted(tmp_path):
    cfg = _cfg(
        tmp_path,
        "cluster.container=pyxis",
        f"cluster.image='{IMAGE}'",
        "cluster.container_binds=[/fsx,/opt/efa:/efa:ro]",
        "cluster.container_flags=['--no-container-mount-home','--container-env=A B']",
    )
    ranks, sup = _lines(cfg)
    root = f"{tmp_path}/runs"
    mounts = f"--container-mounts={root}:{root},/fsx:/fsx,/opt/efa:/efa:ro"
    assert _container_flags(ranks) == _container_flags(sup) == [
        f"--container-image={IMAGE}", mounts, "--no-container-mount-home", "--container-env=A B",
    ]  # fmt: skip
    text = slurm_submit.render_sbatch(cfg, locate(cfg))
    assert "'--container-env=A B'" in text  # shlex.quote: one argument, never split by the shell


def test_apptainer_binary_gpu_flag_flags_and_binds(tmp_path):
    cfg = _cfg(
        tmp_path,
        "cluster.container=apptainer",
        "cluster.image=/images/train.sif",
        "cluster.apptainer_binary=singularity",
        "cluster.apptainer_gpu=rocm",
        "cluster.container_flags=[--cleanenv]",
        "cluster.container_binds=[/opt/cray:/opt/cray:ro,/var/spool/slurmd]",
    )
    ranks, sup = _lines(cfg)
    root = f"{tmp_path}/runs"
    want = ["singularity", "exec", "--rocm", "--cleanenv", "--bind", root, "--bind",
            "/opt/cray:/opt/cray:ro", "--bind", "/var/spool/slurmd:/var/spool/slurmd",
            "/images/train.sif", "python"]  # fmt: skip
    assert ranks[ranks.index("singularity") :][: len(want)] == want
    assert sup[sup.index("singularity") :] == want  # the supervisor runs the same command
    none = _cfg(tmp_path, "cluster.container=apptainer", "cluster.image=/images/i.sif",
                "cluster.apptainer_gpu=none")  # fmt: skip
    assert "--nv" not in _lines(none)[0] and "apptainer" in _lines(none)[0]


def _token_file(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\1\0" * 4096)
    path.with_suffix(".json").write_text('{"dtype": "uint16"}')
    return path


def test_data_outside_the_runs_root_is_bound_read_only_inside_it_is_not(tmp_path):
    data = _token_file(tmp_path / "data" / "corpus.bin")
    base = ["cluster.container=apptainer", "cluster.image=/images/i.sif", "data=tokens",
            "data.seq_len=16", f"data.path={data}"]  # fmt: skip
    argv = _lines(_cfg(tmp_path, *base))[0]
    assert f"{data}:{data}:ro" in argv and f"{data.with_suffix('.json')}:" in " ".join(argv)
    covered = _lines(_cfg(tmp_path, *base, f"cluster.container_binds=[{tmp_path}/data]"))[0]
    assert f"{data}:{data}:ro" not in covered and f"{tmp_path}/data:{tmp_path}/data" in covered
    inside = _token_file(tmp_path / "runs" / "corpus.bin")
    argv = _lines(_cfg(tmp_path, *base[:4], f"data.path={inside}"))[0]
    assert not [a for a in argv if "corpus" in a]


def test_oci_bundle_mounts_the_binds(tmp_path):
    cfg = _cfg(tmp_path, "cluster.container_binds=[/opt/cray:/cray:ro]")
    spec = container.run_bundle(cfg, {"root": {"path": "/r"}, "mounts": []})
    assert {"destination": "/cray", "type": "bind", "source": "/opt/cray",
            "options": ["rbind", "ro"]} in spec["mounts"]  # fmt: skip


# fmt: off
REFUSED = [  # (overrides, what the line names, its fix)
    (["cluster.container_binds=['/scratch/$USER']"], "cluster.container_binds entry '/scratch/$USER'", "write the path out"),
    (["cluster.container_binds=[scratch]"], "'scratch' is not an absolute path", "e.g. cluster.container_binds="),
    (["cluster.container_binds=['/a,/b']"], "a comma would split it", "e.g."),
    (["cluster.container_binds=['/a:/b:rx']"], "not SRC[:DST[:ro]]", "ro or rw"),
    (["cluster.apptainer_binary=docker"], "cluster.apptainer_binary='docker'", "singularity"),
    (["cluster.apptainer_gpu=cuda"], "cluster.apptainer_gpu='cuda'", "cluster.apptainer_gpu=rocm"),
    (["cluster.container=apptainer", "cluster.container_flags=[--nv]"], "entry '--nv'", "cluster.apptainer_gpu=nv"),
    (["cluster.container=apptainer", "cluster.container_flags=['-B=/x']"], "entry '-B=/x'", "cluster.container_binds="),
    (["cluster.container=pyxis", "cluster.container_flags=['--mpi=pmi2']"], "not a pyxis flag", "cluster.srun_extra"),
    (["cluster.container=pyxis", "cluster.srun_extra=['--container-mounts=/a:/a']"], "cluster.srun_extra='--container-mounts=/a:/a'", "cluster.container_binds"),
    (["cluster.container=oci", "cluster.container_flags=[--cleanenv]"], "takes no flags", "cluster.container_binds"),
    (["cluster.container_flags=[cleanenv]"], "entry 'cleanenv'", "--flag=VALUE"),
]
# fmt: on


@pytest.mark.parametrize("overrides,named,fix", REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_bad_values_are_refused_at_login_in_one_line(tmp_path, overrides, named, fix):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", f"runs_root={tmp_path}", *overrides])
    with pytest.raises(ConfigError) as err:
        check_all(cfg)
    line = str(err.value)
    assert "\n" not in line and named in line and fix in line, line
