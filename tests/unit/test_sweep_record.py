"""A sweep records every point as a single run does, and makes them durable together.

Each point still gets its config.yaml, overrides and provenance in its own run directory, and its
`submitted` event in its ledger; what changes is when the fsyncs happen: not one after the other
while each point is written (some 250 for 64 points), but all together once every point is
written (durable.persist: side by side, sharing the filesystem's journal commits), before sbatch
and again after the `submitted` events.
"""

from __future__ import annotations

import os
from importlib import metadata

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from slurmtrain.common import durable, events, provenance, schema
from slurmtrain.common.rundir import RunDir, fingerprint
from slurmtrain.login import prepare

schema.register()


def _points(tmp_path, n):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfgs = [
            compose(
                "config", overrides=["cluster=local", f"runs_root={tmp_path}", f"train.seed={i}"]
            )
            for i in range(n)
        ]
    return [prepare.check(prepare.resolve(cfg), quiet=True) for cfg in cfgs]


def test_points_are_recorded_without_an_fsync_each_then_fsynced_together(tmp_path, monkeypatch):
    points = _points(tmp_path, 4)
    fsyncs = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (fsyncs.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))
    )
    for i, p in enumerate(points):
        prepare.record(p, [f"train.seed={i}"], durable=False)
        p.run.record(events.Submitted(executor="slurm"), job_id=f"7_{i}", durable=False)
    assert fsyncs == []
    durable.persist(p for point in points for p in (point.run.config, point.run.path))
    assert sorted(fsyncs) == sorted(str(p) for pt in points for p in (pt.run.config, pt.run.path))
    assert len({p.run.path for p in points}) == 4
    for i, p in enumerate(points):
        written = yaml.safe_load(p.run.config.read_text())
        assert (
            written == OmegaConf.to_container(p.cfg, resolve=True) and written["train"]["seed"] == i
        )
        assert p.run.path.name == fingerprint(p.cfg)  # what was fingerprinted is what was written
        assert yaml.safe_load((p.run.path / "overrides.yaml").read_text()) == [f"train.seed={i}"]
        assert (p.run.provenance / "submit_1.json").is_file()
        [sub] = [e for e in RunDir(p.run.path).events() if isinstance(e, events.Submitted)]
        assert sub.job_id == f"7_{i}"


def test_a_single_run_still_fsyncs_each_file(tmp_path, monkeypatch):
    [p] = _points(tmp_path, 1)
    fsyncs = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real(fd)))
    prepare.record(p, [])
    assert fsyncs  # config.yaml
    before = len(fsyncs)
    p.run.record(events.Submitted(executor="slurm"), job_id="8")
    assert len(fsyncs) > before  # a fate-deciding event


def test_pip_freeze_is_what_importlib_metadata_says():
    expected = {
        f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]
    }
    assert provenance.packages() == sorted(expected, key=str.lower)


def test_config_yaml_is_the_whole_config_written_at_once(tmp_path):
    """config_yaml writes each top-level section once per distinct value (a sweep's points share
    most); the text is still exactly libyaml's dump of the whole config, and reads back as it."""
    from omegaconf._utils import get_omega_conf_dumper

    from slurmtrain.common.rundir import config_yaml

    class Dumper(yaml.CDumper):
        pass

    Dumper.add_representer(str, get_omega_conf_dumper().str_representer)
    sweeps = [
        ["optim.lr=1e-4"],
        ["optim.lr=2e-4"],
        ["optim.lr=1e-4"],
        ["data=blend"],
        ["name='1e3'"],
    ]
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        for overrides in sweeps:
            cfg = compose(
                "config", overrides=["cluster=local", f"runs_root={tmp_path}", *overrides]
            )
            data = schema.plain(cfg)  # Enums as their names, as config.yaml stores them
            whole = yaml.dump(
                data, Dumper=Dumper, default_flow_style=False, allow_unicode=True, sort_keys=False
            )
            assert config_yaml(cfg) == whole
            assert yaml.safe_load(config_yaml(cfg)) == data
