"""The sweep's per-point shortcuts give what the slow paths give, exactly.

A 64-point sweep reads each point's config as plain dicts (login/view.plain, not OmegaConf's
to_container), as dataclasses (view.build, not OmegaConf.to_object), parses a point's number
without Hydra's grammar (the launcher's _parse), and fingerprints a copy made only along the keys
it drops: each is checked here against the path it replaces, on configs that exercise them
(an interpolation, a typed string node, Enums, lists, a tracker section, model=hf's keys).
"""

from __future__ import annotations

import copy

import pytest
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hydra_plugins.slurmtrain_launcher.launcher import SlurmtrainLauncher
from slurmtrain.common import rundir, schema
from slurmtrain.common.nested_copy import copied_along
from slurmtrain.login import view

schema.register()

POINTS = [
    ["runs_root=/tmp/x", "optim.lr=0.001"],  # name: ${model.name}, a str node's reference
    ["runs_root=/tmp/x", "name=fixed", "cluster=slurm", "model=opt13b"],
    ["cluster=slurm"],  # runs_root: ${oc.env:...}, a resolver: OmegaConf's own walk
    ["runs_root=/tmp/x", "logger=wandb", "data=text"],
    ["runs_root=/tmp/x", "+cluster.env.LR=${optim.lr}"],  # a float into a str node: converted
]


@pytest.fixture(scope="module")
def configs():
    with initialize_config_module("slurmtrain.conf", version_base="1.3"):
        made = []
        for overrides in POINTS:
            cfg = compose("config", overrides=overrides)
            OmegaConf.set_struct(cfg, False)
            cfg.pop("hydra", None)
            OmegaConf.set_struct(cfg, True)
            made.append(cfg)
        return made


def test_plain_and_build_match_omegaconf(configs):
    for cfg in configs:
        raw = view.plain(cfg)
        assert repr(raw) == repr(schema.plain(cfg))  # types too: 1 is not 1.0 in a fingerprint
        assert view.build(raw) == OmegaConf.to_object(cfg)


def test_fingerprint_leaves_the_shared_config_as_it_was(configs):
    data = {"a": {"b": {"c": 1, "d": [1]}, "e": 2}, "f": {"g": 3}}
    out = copied_along(data, ["a.b.c", "x.y"])
    out["a"]["b"].pop("c")
    assert (
        data["a"]["b"]["c"] == 1
        and out["f"] is data["f"]
        and out["a"]["b"]["d"] is data["a"]["b"]["d"]
    )
    for cfg in configs:
        data = view.plain(cfg)
        before = copy.deepcopy(data)
        assert rundir.fingerprint(cfg, data) == rundir.fingerprint(cfg)
        assert data == before


@pytest.mark.parametrize(
    "line",
    [
        "optim.lr=0.0001",
        "seed=3",
        "optim.lr=1e-05",
        "a.b=-2.5",
        "a=0",
        "a=1E5",
        "a=1.",
        "a=+3",
        "a=1_000",
        "a=007",
        "a=.5",
        "a=inf",
        "hydra.x=1",
        "a='1'",
        "a=1,2",
        "+a=1",
    ],
)
def test_a_number_is_parsed_as_hydra_parses_it(line):
    launcher = SlurmtrainLauncher()
    [theirs] = OverridesParser.create().parse_overrides([line])
    assert launcher._parse(line) == theirs


def test_values_validation_fills_in_are_written_as_omegaconf_types_them(configs):
    """login/view._written hands a derived value (min_lr, max_steps, cluster.time...) to the
    typed node itself: the config then reads as after a setattr, and the plain dict check hands on
    is the config's own."""
    from slurmtrain.login.prepare import resolved

    with initialize_config_module("slurmtrain.conf", version_base="1.3"):
        cfg = compose("config", overrides=["cluster=slurm", "runs_root=/tmp/x", "name=n"])
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    OmegaConf.set_struct(cfg, True)
    slow = cfg.copy()
    made, raw = resolved(cfg, copy=False)
    assert raw is not None and repr(raw) == repr(schema.plain(made))
    original = view._written  # the same validation through OmegaConf's own setattr
    view._written = lambda node, key, value: (setattr(node, key, value), getattr(node, key))[1]
    try:
        theirs, _ = resolved(slow, copy=False)
    finally:
        view._written = original
    assert OmegaConf.to_yaml(made) == OmegaConf.to_yaml(theirs)
