"""Fingerprints are stable across versions: each shipped recipe, composed as a user would, keeps
the run directory name users have on disk (pinned from main at 3a732a1), and a result key added
later with its default (registered in common/fingerprint.py) leaves it alone."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from slurmtrain.common import fingerprint, rundir, schema
from slurmtrain.common.rundir import create, locate
from slurmtrain.login.prepare import resolve
from tests.conftest import run_cli

SHIPPED = dict(fingerprint.ADDED_RESULT_KEYS)  # the keys this version registers, oldest first

schema.register()

# (model, overrides, fingerprint). The recipe comes with the model (conf/config.yaml: recipe:
# ${model}). Each is what main at 3a732a1 computed, except opt66b's: its recipe's micro batch
# became 1 (1024 sequences over 64 x 8 GPUs; 73d2e9d75541 before, a run that could not fit).
GOLDEN = [
    ("opt_tiny", (), "34307bf8b1dd"),
    ("opt125m", (), "0498a1a7a313"),
    ("opt350m", (), "27b3f6b59fd2"),
    ("opt1.3b", (), "e3586fbb7b81"),
    ("opt2.7b", (), "80c4874f1c0f"),
    ("opt6.7b", (), "2fba7125f687"),
    ("opt13b", (), "93d967570535"),
    ("opt30b", (), "3f00c4122bab"),
    ("opt66b", (), "a2dd1342f1fe"),
    ("opt125m", ("train.max_steps=20", "optim.lr=3e-4"), "c067143413bc"),
    ("opt13b", ("deepspeed=zero3", "model.activation_checkpointing=true"), "ec48a72e2a25"),
    ("opt1.3b", ("data.seq_len=1024", "model.dropout=0.0"), "dfcf0448c525"),
    # the model families and the Llama recipe (chosen with recipe=, not by the model's name)
    ("llama_tiny", (), "4aa4c710a781"),
    ("llama_tiny", ("recipe=llama",), "838a78b09683"),
    ("qwen2_tiny", (), "8cd18423e741"),
    ("llama3_8b", ("recipe=llama",), "85d1921ab1dd"),
    ("mistral_7b", (), "86462f992717"),
    ("opt_demo", (), "f7dbb3f0ad95"),  # tools/demo.sh's model and recipe, as first shipped
]


def _cfg(tmp_path, model: str, *overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"runs_root={tmp_path}",
                "cluster=local",
                "gpus_per_node=0",
                f"model={model}",
                *overrides,
            ],
        )
    return resolve(cfg)


def test_every_shipped_recipe_is_pinned():
    from pathlib import Path

    recipes = {p.stem for p in (Path(schema.conf_dir()) / "recipe").glob("*.yaml")}
    chosen = {o.split("=", 1)[1] for _, overrides, _ in GOLDEN for o in overrides if "recipe=" in o}
    pinned = {model for model, _, _ in GOLDEN} | chosen
    assert recipes and recipes <= pinned  # a new recipe: pin it here


@pytest.mark.parametrize("model,overrides,golden", GOLDEN)
def test_each_shipped_recipe_keeps_its_fingerprint(tmp_path, model, overrides, golden):
    assert rundir.fingerprint(_cfg(tmp_path, model, *overrides)) == golden


def test_the_command_line_composes_the_same_fingerprint(tmp_path):
    model, overrides, golden = GOLDEN[10]  # opt13b, zero3 + activation checkpointing
    args = [f"model={model}", *overrides, "nodes=2", "gpus_per_node=0", "cluster=local"]
    done = run_cli([*args, f"runs_root={tmp_path}", "dry_run=true"], cwd=tmp_path)
    # shown, then refused as a real local submission of nodes=2 is (issue 35)
    assert done.returncode == 2 and "the local executor runs on this machine only" in done.stderr
    # the resolved config, as a run directory has it: the dry run writes it and prints its path
    [shown] = re.findall(r"full config \(or --cfg job\):\s+(\S+)", done.stdout)
    assert rundir.fingerprint(schema.load_run_config(shown)) == golden


def _with(cfg, key: str, value):
    """The resolved config of a later version whose schema has `key` (its value `value`)."""
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def test_a_result_key_added_with_its_default_leaves_every_fingerprint_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(
        fingerprint,
        "ADDED_RESULT_KEYS",
        {**SHIPPED, "train.label_smoothing": 0.0, "lora": {"rank": 0, "alpha": 16.0}},
    )
    for model, overrides, golden in GOLDEN:
        later = _with(_cfg(tmp_path, model, *overrides), "train.label_smoothing", 0.0)
        later = _with(later, "lora", {"rank": 0, "alpha": 16.0})
        assert rundir.fingerprint(later) == golden, (model, overrides)
    base = _cfg(tmp_path, "opt13b")
    smoothed = rundir.fingerprint(_with(base, "train.label_smoothing", 0.1))
    lora = rundir.fingerprint(_with(base, "lora", {"rank": 8, "alpha": 16.0}))
    assert len({smoothed, lora, rundir.fingerprint(base)}) == 3  # another value is another run
    assert rundir.fingerprint(_with(base, "train.label_smoothing", 0)) != rundir.fingerprint(
        base
    )  # int != 0.0


def test_an_unregistered_new_key_would_have_renamed_the_run(tmp_path, monkeypatch):
    # What the registry prevents (and the guard test catches): the same upgrade, unregistered.
    monkeypatch.setattr(fingerprint, "ADDED_RESULT_KEYS", dict(SHIPPED))
    base = _cfg(tmp_path, "opt13b")
    assert rundir.fingerprint(_with(base, "train.label_smoothing", 0.0)) != rundir.fingerprint(base)


def test_a_run_made_before_its_key_was_registered_is_resumed_not_restarted(tmp_path, monkeypatch):
    # A version that had train.label_smoothing but hashed it (not registered yet) made this run.
    monkeypatch.setattr(fingerprint, "ADDED_RESULT_KEYS", dict(SHIPPED))
    old = _with(_cfg(tmp_path, "opt13b"), "train.label_smoothing", 0.0)
    made = locate(old)
    create(made, old, ["model=opt13b"])
    assert made.path.name != "93d967570535"
    # After the upgrade that registers it, the same command finds that directory.
    registered = {**SHIPPED, "train.label_smoothing": 0.0, "lora": {"rank": 0}}  # oldest first
    monkeypatch.setattr(fingerprint, "ADDED_RESULT_KEYS", registered)
    now = _with(_cfg(tmp_path, "opt13b"), "train.label_smoothing", 0.0)
    now = _with(now, "lora", {"rank": 0})
    assert rundir.fingerprint(now) == "93d967570535" and locate(now).path == made.path
    # A run under today's name wins over the legacy one; another config matches neither.
    create(locate(_cfg(tmp_path, "opt13b")), _cfg(tmp_path, "opt13b"), [])
    assert locate(now).path.name == "93d967570535"
    other = _with(_cfg(tmp_path, "opt125m"), "train.label_smoothing", 0.0)
    assert locate(other).path.name == rundir.fingerprint(other) == "0498a1a7a313"
