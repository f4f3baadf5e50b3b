"""A sweep point composed by the slurmtrain launcher is the config Hydra itself composes for it.

The launcher composes the sweep's config groups once and clones that for every point, setting the
point's plain values through OmegaConf; a point must still be typed (a float key turns `1` into
1.0, a bad value is refused), fingerprint like the same config submitted alone (duplicate
detection across single runs and sweeps), and share nothing with the other points.
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
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


@pytest.fixture
def launcher(tmp_path):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        sweep = [*COMMON, f"runs_root={tmp_path}"]
        cfg = loader.load_configuration("config", overrides=sweep, run_mode=RunMode.MULTIRUN)
        ours = SlurmtrainLauncher()
        ours.setup(
            hydra_context=HydraContext(config_loader=loader, callbacks=None),
            task_function=lambda _: None,
            config=cfg,
        )
        yield ours


def _hydras(overrides):
    """Hydra's own composition of the point (inside the fixture's initialized Hydra)."""
    cfg = compose("config", overrides=overrides)
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    OmegaConf.set_struct(cfg, True)
    return cfg


@pytest.mark.parametrize(
    "point",
    [
        ["optim.lr=1"],  # an int for a float key: converted, as Hydra's own composition does
        ["optim.lr=3e-4", "train.seed=7", "name=other"],
        ["model=opt125m", "optim.lr=2e-4"],  # a config group: composed, not patched
        ["deepspeed=zero3", "train.max_steps=5"],
    ],
)
def test_point_is_what_hydra_composes(launcher, tmp_path, point):
    overrides = [*COMMON, f"runs_root={tmp_path}", *point]
    ours, theirs = launcher._compose(overrides), _hydras(overrides)
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs)
    assert OmegaConf.is_struct(ours) and OmegaConf.get_type(ours) is OmegaConf.get_type(theirs)
    for key in ("optim", "train", "cluster", "model", "deepspeed"):
        assert OmegaConf.get_type(ours[key]) is OmegaConf.get_type(theirs[key]), key
    assert type(ours.optim.lr) is float
    assert fingerprint(resolve(ours)) == fingerprint(resolve(theirs))


def test_a_bad_value_is_refused_as_hydra_refuses_it(launcher, tmp_path):
    overrides = [*COMMON, f"runs_root={tmp_path}", "train.max_steps=many"]
    with pytest.raises(Exception) as theirs:
        _hydras(overrides)
    with pytest.raises(ValidationError) as ours:
        launcher._compose(overrides)
    line = one_line(ours.value)
    assert line == one_line(theirs.value) and line.startswith("train.max_steps='many'")


def test_points_share_nothing(launcher, tmp_path):
    base = [*COMMON, f"runs_root={tmp_path}"]
    a, b = launcher._compose([*base, "optim.lr=1e-4"]), launcher._compose([*base, "optim.lr=2e-4"])
    resolve(a)  # mutates: runs_root, derived batch, resources
    a.train.seed = 987654
    c = launcher._compose([*base, "optim.lr=1e-4"])
    assert (a.optim.lr, b.optim.lr) == (1e-4, 2e-4)
    assert b.train.seed == c.train.seed != 987654
    assert OmegaConf.to_yaml(c) == OmegaConf.to_yaml(_hydras([*base, "optim.lr=1e-4"]))
