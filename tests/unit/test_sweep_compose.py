"""A sweep point composed by the slurmtrain launcher is the config Hydra itself composes for it.

The launcher does not ask Hydra to compose every point: points that differ from the command line
only in plain values reuse Hydra's composition of the command line, other choices of config
groups are composed once each, and each point is a clone with its values set through OmegaConf.
A point must still be typed (a float key turns `1` into 1.0, a bad value is refused the way Hydra
refuses it), fingerprint like the same config submitted alone (duplicate detection across single
runs and sweeps), and share nothing with the other points.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import setup_globals
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from hydra_plugins.slurmtrain_launcher.launcher import SlurmtrainLauncher
from slurmtrain.common import schema
from slurmtrain.common.hydra_errors import one_line
from slurmtrain.common.rundir import fingerprint
from slurmtrain.login.prepare import resolve

schema.register()
setup_globals()

COMMON = ["cluster=local", "+cluster.sbatch_extra.hold=true"]


@contextmanager
def multirun(line):
    """The launcher as Hydra's multirun sets it up for `-m LINE`, and the sweep's points as the
    sweeper hands them over; `.composed` lists the points Hydra itself was asked to compose."""
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        cfg = loader.load_configuration("config", overrides=line, run_mode=RunMode.MULTIRUN)
        ours = SlurmtrainLauncher()
        ours.setup(
            hydra_context=HydraContext(config_loader=loader, callbacks=None),
            task_function=lambda _: None,
            config=cfg,
        )
        ours.composed = []
        real = loader.load_sweep_config

        def counted(master, overrides):
            ours.composed.append(overrides)
            return real(master, overrides)

        loader.load_sweep_config = counted
        parsed = OverridesParser.create().parse_overrides(line)
        [points] = BasicSweeper.split_arguments(parsed, None)
        yield ours, points


def _hydras(overrides):
    """Hydra's own composition of one point (inside multirun's initialized Hydra)."""
    cfg = compose("config", overrides=overrides)
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    OmegaConf.set_struct(cfg, True)
    return cfg


@pytest.mark.parametrize(
    "sweep,composed",
    [
        (["optim.lr=1,3e-4"], 0),  # `1` for a float key: 1.0, as Hydra's composition makes it
        (["optim.lr=3e-4", "train.seed=7,8", "name=other"], 0),
        (["deepspeed=zero3", "train.max_steps=5,6"], 0),  # a group, but the command line's
        (["model=opt125m,opt_tiny", "optim.lr=2e-4"], 2),  # swept groups: composed, once each
    ],
)
def test_point_is_what_hydra_composes(tmp_path, sweep, composed):
    with multirun([*COMMON, f"runs_root={tmp_path}", *sweep]) as (launcher, points):
        assert len(points) == 2
        for point in points:
            ours, theirs = launcher._compose(point), _hydras(point)
            assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs)
            assert OmegaConf.is_struct(ours)
            assert OmegaConf.get_type(ours) is OmegaConf.get_type(theirs)
            for key in ("optim", "train", "cluster", "model", "deepspeed"):
                assert OmegaConf.get_type(ours[key]) is OmegaConf.get_type(theirs[key]), key
            assert type(ours.optim.lr) is float
            assert fingerprint(resolve(ours)) == fingerprint(resolve(theirs))
        assert len(launcher.composed) == composed


def test_a_bad_value_is_refused_as_hydra_refuses_it(tmp_path):
    with multirun([*COMMON, f"runs_root={tmp_path}", "train.max_steps=many,3"]) as (launcher, pts):
        with pytest.raises(Exception) as theirs:
            _hydras(pts[0])
        with pytest.raises(ValidationError) as ours:
            launcher._compose(pts[0])
    line = one_line(ours.value)
    assert line == one_line(theirs.value) and line.startswith("train.max_steps='many'")


def test_points_share_nothing(tmp_path):
    with multirun([*COMMON, f"runs_root={tmp_path}", "optim.lr=1e-4,2e-4"]) as (launcher, pts):
        hydras = OmegaConf.to_yaml(launcher.config)
        a, b = launcher._compose(pts[0]), launcher._compose(pts[1])
        resolve(a)  # mutates: runs_root, derived batch, resources
        a.train.seed = 987654
        c = launcher._compose(pts[0])
        assert (a.optim.lr, b.optim.lr) == (1e-4, 2e-4)
        assert b.train.seed == c.train.seed != 987654
        assert OmegaConf.to_yaml(c) == OmegaConf.to_yaml(_hydras(pts[0]))
        assert OmegaConf.to_yaml(launcher.config) == hydras  # Hydra's own composition: untouched
