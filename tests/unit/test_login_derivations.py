"""`check` derives each number once: the Derived object built at its start is what the plan, the
cluster check and the lines after read (issue 34, build 4). Every derivation function is wrapped
with a counter wherever the package holds it (a module that imported it by name included)."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from contextlib import ExitStack
from typing import Callable

import pytest

from slurmtrain.common import derived, schema
from slurmtrain.login import prepare
from slurmtrain.planning import deadlines, mfu, policy, preflight
from tests.plans import composed

pytestmark = pytest.mark.usefixtures("no_slurm")

# The derivations: derived.py's numbers, and the planner's that several plan lines read.
ONCE = [
    (derived, name)
    for name in (
        "node_range",
        "tasks_per_node",
        "tensor_parallel",
        "sequence_parallel",
        "model_parallel",
        "resolved_dtype",
        "restarts_in_allocation",
        "world_size",
        "parallel_text",
    )
] + [(preflight, "report"), (mfu, "_planned")]
# One per distinct world size (nodes=2-4 plans the smallest and the largest allocation).
PER_WORLD = [
    (derived, "_data_parallel"),
    (derived, "_grad_accumulation"),
    (derived, "data_parallel"),
    (derived, "grad_accumulation"),
    (policy, "_planned_tokens_per_s"),
    (deadlines, "config_layout"),
]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counted: Counter[str] = Counter()
    originals = {getattr(module, name): name for module, name in ONCE + PER_WORLD}

    def counting(f: Callable[..., object], name: str) -> Callable[..., object]:
        @functools.wraps(f)
        def wrapper(*args: object, **kwargs: object) -> object:
            counted[name] += 1
            return f(*args, **kwargs)

        return wrapper

    # by identity: a module may hold a callable that is unhashable (a dataclass instance)
    wrapped = {id(f): counting(f, name) for f, name in originals.items()}
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("slurmtrain")]:
        for attr, value in list(vars(module).items()):
            if callable(value) and id(value) in wrapped:
                monkeypatch.setattr(module, attr, wrapped[id(value)])
    return counted


def _resolved(tmp_path, *overrides):  # type: ignore[no-untyped-def]
    return prepare.resolve(composed(tmp_path, "dry_run=true", *overrides))


@pytest.mark.parametrize(
    "overrides, worlds",
    [
        ((), 1),  # CPU ranks on this machine
        (("model=opt1.3b", "gpus_per_node=8", "nodes=2-4", "parallel.tensor=2"), 2),
    ],
)
def test_each_derivation_is_computed_once_per_check(tmp_path, calls, overrides, worlds):
    cfg = _resolved(tmp_path, *overrides)
    calls.clear()  # what resolve derived (validation) is not check's
    assert prepare.check(cfg, quiet=True) is not None
    assert calls["report"] == 1
    assert {name: n for name, n in calls.items() if name in {n for _, n in ONCE} and n > 1} == {}
    per_world = {name for _, name in PER_WORLD}
    assert {name: n for name, n in calls.items() if name in per_world and n > worlds} == {}


def test_a_sweeps_points_each_derive_once(tmp_path, calls):
    cfgs = [_resolved(tmp_path, "model=opt125m", f"optim.lr={lr}") for lr in (1e-4, 2e-4, 3e-4)]
    calls.clear()
    with ExitStack() as locks:
        points = prepare.check_points(cfgs, locks)
    assert all(p is not None for p in points)
    assert calls["report"] == 3
    assert {name: n for name, n in calls.items() if n > 3} == {}
    # the plan each point's submission reads is the one its check derived
    assert all(derived.derived_of(p.typed_cfg).params for p in points if p is not None)


@pytest.mark.parametrize(
    "overrides, known",
    [
        ((), True),
        (("cluster=slurm", "nodes=2-4", "faults.spare_nodes=1"), True),
        (("train.tokens=1e9", "optim.warmup_tokens=1e6", "+cluster.env.X=${optim.lr}"), True),
        (("+cluster.env.STEPS=${train.max_steps}",), False),  # reads a key validation fills in
    ],
)
def test_the_plain_config_handed_to_check_is_schema_plains(tmp_path, overrides, known):
    """resolved() hands check the config as schema.plain gives it (what is fingerprinted and
    written) without making it again; None where an interpolation reads a value it filled in."""
    cfg, raw = prepare.resolved(composed(tmp_path, "dry_run=true", *overrides))
    assert (raw is not None) == known
    if raw is not None:
        assert repr(raw) == repr(schema.plain(cfg))  # types and key order too: 1 is not 1.0
