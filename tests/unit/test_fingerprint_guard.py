"""The guard on fingerprint stability: a result key added to the schema without registering it
(slurmtrain/common/fingerprint.py ADDED_RESULT_KEYS) would rename every user's run directory, so
an upgrade would restart their unfinished runs from step 0. The baseline is frozen in
fingerprint_baseline_keys.json (main at 3a732a1)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurmtrain.common import fingerprint
from slurmtrain.common.schema import RootConfig, TrainConfig

SHIPPED = dict(fingerprint.ADDED_RESULT_KEYS)  # the keys this version registers

BASELINE = json.loads((Path(__file__).parent / "fingerprint_baseline_keys.json").read_text())
BASELINE_KEYS: list[str] = BASELINE["result_keys"]


def test_every_result_key_of_the_schema_is_in_the_baseline_or_registered():
    problems = fingerprint.registry_problems(BASELINE_KEYS)
    assert not problems, "\n".join(problems)


def test_the_baseline_is_what_the_fingerprint_hashed():
    # The section names and a few leaves users' fingerprints depend on (a corrupt baseline file
    # would otherwise pass the guard above vacuously).
    assert {k.split(".")[0] for k in BASELINE_KEYS} == {
        "model",
        "data",
        "optim",
        "deepspeed",
        "train",
    }
    assert {"train.micro_batch_size", "optim.lr", "model.num_layers"} <= set(BASELINE_KEYS)
    assert not {"nodes", "cluster.partition", "checkpoint.keep_last"} & set(BASELINE_KEYS)


# A future schema: a result key added to TrainConfig with its default, and a new result section.
@dataclass
class _FutureTrain(TrainConfig):
    label_smoothing: float = 0.0


@dataclass
class _Lora:
    rank: int = 0
    alpha: float = 16.0


@dataclass
class _FutureRoot(RootConfig):
    train: _FutureTrain = field(default_factory=_FutureTrain)
    lora: _Lora = field(default_factory=_Lora)


def test_a_new_result_key_not_registered_is_named_with_what_to_do(monkeypatch):
    monkeypatch.setattr(fingerprint, "ADDED_RESULT_KEYS", dict(SHIPPED))
    problems = fingerprint.registry_problems(BASELINE_KEYS, _FutureRoot)
    assert len(problems) == 3, problems
    line = next(p for p in problems if "train.label_smoothing" in p)
    assert "slurmtrain/common/fingerprint.py ADDED_RESULT_KEYS" in line
    assert "'train.label_smoothing': <the default it ships with>" in line
    assert "NON_RESULT_KEYS" in line and "\n" not in line


def test_registered_keys_pass_and_a_wrong_default_is_named(monkeypatch):
    monkeypatch.setattr(
        fingerprint,
        "ADDED_RESULT_KEYS",
        {**SHIPPED, "train.label_smoothing": 0.0, "lora": {"rank": 0, "alpha": 16.0}},
    )
    assert fingerprint.registry_problems(BASELINE_KEYS, _FutureRoot) == []
    monkeypatch.setattr(
        fingerprint, "ADDED_RESULT_KEYS", {**SHIPPED, "train.label_smoothing": 0.1, "lora": {}}
    )
    problems = fingerprint.registry_problems(BASELINE_KEYS, _FutureRoot)
    assert any("'train.label_smoothing'] = 0.1" in p and "0.0" in p for p in problems), problems


@pytest.mark.parametrize(
    "entry", ["train.micro_batch_size", "cluster.partition", "train.no_such_key"]
)
def test_registering_a_baseline_non_result_or_unknown_key_is_refused(monkeypatch, entry):
    monkeypatch.setattr(fingerprint, "ADDED_RESULT_KEYS", {**SHIPPED, entry: 1})
    problems = fingerprint.registry_problems(BASELINE_KEYS)
    assert problems and f"ADDED_RESULT_KEYS[{entry!r}]" in problems[0], problems


def test_reclassifying_or_removing_a_baseline_key_is_named(monkeypatch):
    from slurmtrain.common import schema

    monkeypatch.setattr(schema, "NON_RESULT_KEYS", (*schema.NON_RESULT_KEYS, "model.dropout"))
    problems = fingerprint.registry_problems(BASELINE_KEYS)
    assert problems == [
        "config key model.dropout is now a non-result key: every run's fingerprint changes "
        "(users' unfinished runs restart from step 0); keep it a result key with its default"
    ]
