"""Numbers outside their range are refused with one line naming the key, the value and the fix.

Before these checks each value below composed, validated and (outside a dry run) trained: a
negative budget stopped a run at its first failure, `optim.name=sgd` trained AdamW, a negative
checkpoint interval never saved.
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import schema, validation
from slurmtrain.common.errors import ConfigError
from tests.conftest import run_cli

schema.register()

REFUSED = [
    ("optim.lr=-1", "optim.lr=-1.0: must be a number > 0"),
    ("optim.lr=inf", "optim.lr=inf: must be a number > 0"),
    ("optim.eps=0", "optim.eps=0.0: must be a number > 0"),
    ("optim.beta1=1.5", "optim.beta1=1.5: must be >= 0 and < 1"),
    ("optim.beta2=-0.1", "optim.beta2=-0.1: must be >= 0 and < 1"),
    ("optim.weight_decay=-1", "optim.weight_decay=-1.0: must be a number >= 0"),
    ("optim.grad_clip=-1", "optim.grad_clip=-1.0: must be a number >= 0 (0: no clipping)"),
    ("data.max_corpus_bytes=0", "data.max_corpus_bytes=0: must be a number >= 1"),
    ("checkpoint.interval_steps=-1", "checkpoint.interval_steps=-1: must be a number >= 0"),
    ("checkpoint.interval_minutes=-1", "checkpoint.interval_minutes=-1.0: must be a number >= 0"),
    ("checkpoint.keep_every=-1", "checkpoint.keep_every=-1: must be a number >= 0"),
    ("checkpoint.publish_timeout_minutes=0", "checkpoint.publish_timeout_minutes=0.0: must be"),
    ("cluster.signal_lead_s=0", "cluster.signal_lead_s=0: must be a number >= 1"),
    ("cluster.array_parallelism=0", "cluster.array_parallelism=0: must be a number >= 1"),
    ("cluster.gpu_mem_gb=0", "cluster.gpu_mem_gb=0: must be a number > 0"),
    ("cluster.mem=lots", "cluster.mem='lots': not a Slurm memory size"),
    ("cluster.mem_per_gpu=8X", "cluster.mem_per_gpu='8X': not a Slurm memory size"),
    ("faults.max_hang=-2", "faults.max_hang=-2: must be a number >= -1 (-1: unlimited)"),
    ("faults.max_rollback=-5", "faults.max_rollback=-5: must be a number >= -1 (-1: unlimited)"),
    ("faults.crash_loop=-1", "faults.crash_loop=-1: must be a number >= 0 (0: off)"),
    ("faults.exclude_hours=-3", "faults.exclude_hours=-3.0: must be >= 0"),
    ("faults.node_check_s=-5", "faults.node_check_s=-5.0: must be a number >= 0"),
    ("faults.collective_timeout_s=0", "faults.collective_timeout_s=0.0: must be a number > 0"),
    ("faults.health_slow_factor=0.5", "faults.health_slow_factor=0.5: must be a number > 1"),
    ("faults.skip_batches=-1", "faults.skip_batches=-1: must be a number >= 0"),
    ("faults.spike_window=0", "faults.spike_window=0: must be a number >= 1"),
    ("faults.hang_timeout_s=0", "faults.hang_timeout_s=0.0: must be a number > 0"),
    ("faults.io_safety=0.5", "faults.io_safety=0.5: must be a number >= 1"),
]


def _validate(*overrides: str) -> None:
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=local", "gpus_per_node=0", *overrides])
    validation.validate_config(cfg, submitting=True)


@pytest.mark.parametrize("override,message", REFUSED)
def test_a_value_out_of_range_is_refused_naming_key_value_and_an_example(override, message):
    with pytest.raises(ConfigError) as err:
        _validate(override)
    key = override.split("=")[0]
    assert str(err.value).startswith(message) and f"e.g. {key}=" in str(err.value)


@pytest.mark.parametrize(
    "override",
    [
        "faults.max_hang=-1",  # unlimited
        "faults.max_rollback=-1",
        "faults.max_rollback=0",  # the first divergence stops the run
        "faults.exclude_hours=-1",  # never expires
        "faults.exclude_hours=0",
        "faults.crash_loop=0",  # off
        "optim.grad_clip=0",
        "optim.lr=1e30",  # diverges: the rollback machinery's drill, not a config error
        "checkpoint.interval_steps=0",
        "cluster.mem=64G",
        "cluster.mem=4000",
    ],
)
def test_the_documented_special_values_are_accepted(override):
    _validate(override)


CHOICES = [
    ("optim.name=sgd", "optim.name='sgd': unknown; choose one of adamw"),
    ("checkpoint.verify=md5", "checkpoint.verify='md5': unknown; choose one of checksum, size"),
    ("cluster.kind=k8s", "cluster.kind='k8s': unknown; choose one of auto, local, slurm"),
]


@pytest.mark.parametrize("override,message", CHOICES)
def test_a_value_outside_an_enum_fails_at_compose_naming_key_value_and_the_choices(
    override, message
):
    from slurmtrain.common.hydra_errors import one_line

    with pytest.raises(Exception) as err:  # Hydra's: the schema's Enum refuses it
        _validate(override)
    line = one_line(err.value)
    key = override.split("=")[0]
    assert line is not None and line.startswith(message) and f"e.g. {key}=" in line


@pytest.mark.parametrize("override,message", CHOICES[1:])
def test_the_cli_refuses_a_bad_choice_in_one_line_exit_2(override, message, tmp_path):
    proc = run_cli([override, f"runs_root={tmp_path}/runs"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"slurmtrain: error: {message}"), lines
    assert not (tmp_path / "runs").exists()


def test_the_cli_refuses_before_writing_anything(tmp_path):
    proc = run_cli(["faults.max_hang=-2", f"runs_root={tmp_path}/runs"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        "slurmtrain: error: faults.max_hang=-2: must be a number >= -1 (-1: unlimited); "
        "e.g. faults.max_hang=3"
    ]
    assert not (tmp_path / "runs").exists()


def test_max_rollback_minus_one_never_caps_the_rollbacks():
    from types import SimpleNamespace

    from slurmtrain.common.events import Rollback
    from slurmtrain.compute.divergence import Divergence, plan_rollback

    faults = SimpleNamespace(max_rollback=-1, skip_batches=10)
    previous = [Rollback(to_step=step) for step in range(0, 1000, 10)]  # 100 rollbacks so far
    d = Divergence(step=1015, loss=float("nan"), why="non-finite loss")
    p = plan_rollback(d, 1010, 0, previous, faults, max_steps=2000, global_batch=8)
    assert p.stop is None and p.to_step == 1010


def test_a_collective_timeout_below_the_hang_deadline_is_refused_naming_both_keys():
    """hang_timeout_s=3600 with the default collective_timeout_s=1800 is refused: NCCL would abort
    a stuck step before the watchdog could dump its stacks."""
    with pytest.raises(ConfigError) as err:
        _validate("faults.hang_timeout_s=3600")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("faults.collective_timeout_s=1800.0 with faults.hang_timeout_s=3600.0")
    assert "set faults.collective_timeout_s=3960" in line  # 3600 + 10 %: distributed.py's rule
    with pytest.raises(ConfigError, match="needs hang_timeout_s \\+ 120 s"):
        _validate("faults.hang_timeout_s=600", "faults.collective_timeout_s=700")
    _validate("faults.hang_timeout_s=3600", "faults.collective_timeout_s=3960")
    _validate("faults.hang_timeout_s=600", "faults.collective_timeout_s=720")
