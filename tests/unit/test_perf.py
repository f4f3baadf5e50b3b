"""Per-step performance accounting: straggler rule, DeepSpeed timer split, bad-node offers, rows."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import ds_config, schema, validation
from slurmtrain.common.errors import ConfigError
from slurmtrain.compute.observe.metrics import scalars, summary_line

os.environ.setdefault("DS_ACCELERATOR", "cpu")
perf = pytest.importorskip("slurmtrain.compute.observe.perf")


def _cfg(*overrides: str):
    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=local", "gpus_per_node=0", *overrides])
    validation.validate_config(cfg, submitting=False)
    return cfg


def _engine_with_deepspeed_timers():
    from deepspeed.utils.timer import SynchronizedWallClockTimer

    return SimpleNamespace(timers=SynchronizedWallClockTimer(), wall_clock_breakdown=lambda: True)


def _record(group, name: str, seconds: float) -> None:
    """One finished interval of a host timer (what start()/stop() append on CPU)."""
    group(name).event_timers.append(seconds)


def test_timer_split_adds_up_and_deepspeed_prints_nothing(capsys):
    engine = _engine_with_deepspeed_timers()
    timers = perf.StepTimers(engine)
    group = engine.timers
    for _ in range(2):  # two optimizer steps, each logged by DeepSpeed's engine and optimizer
        for name, s in (
            ("fwd", 0.010),
            ("bwd", 0.030),
            ("bwd_allreduce", 0.004),
            ("step", 0.008),
            ("optimizer_allgather", 0.002),
            ("fwd_microstep", 0.5),
        ):
            _record(group, name, s)
        group.log(["optimizer_allgather"])  # ZeRO's optimizer logs its own timers first
        group.log(["fwd_microstep"])
        group.log(["fwd", "bwd", "bwd_allreduce", "step"])
    assert capsys.readouterr().out == ""
    fwd, bwd, opt, comm = timers.take(steps=2)
    assert (fwd, bwd, opt, comm) == pytest.approx((0.010, 0.026, 0.006, 0.006))
    assert fwd + bwd + opt + comm == pytest.approx(0.010 + 0.030 + 0.008)
    assert group("fwd_microstep").event_timers == []  # reset as DeepSpeed's log would
    assert timers.take(steps=1) == (0.0, 0.0, 0.0, 0.0)  # per interval: the sums restart


def test_peak_memory_on_cpu_is_the_process_peak_rss():
    import torch

    peak = perf.peak_memory_bytes(torch.device("cpu"))
    with open("/proc/self/status") as f:
        hwm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    assert peak == pytest.approx(hwm_kib * 1024, rel=0.05)


def test_every_number_of_a_row_becomes_a_tensorboard_scalar():
    row = {
        "loss": 2.5,
        "mfu": None,
        "peak_mem_bytes": [10, 12],
        "peak_mem_bytes_max": 12,
        "time_comm": 0.01,
        "note": "x",
        "flag": True,
    }
    assert scalars(row) == {
        "loss": 2.5,
        "peak_mem_bytes/rank0": 10.0,
        "peak_mem_bytes/rank1": 12.0,
        "peak_mem_bytes_max": 12.0,
        "time_comm": 0.01,
    }


def test_summary_line_shows_tflops_mfu_and_eta():
    line = summary_line(
        40,
        200,
        {
            "loss": 4.1,
            "lr": 1e-3,
            "tokens_per_s": 21000.0,
            "step_time": 0.05,
            "tflops_per_gpu": 0.0123,
            "mfu": 0.412,
            "eta_s": 3725.0,
        },
    )
    assert "step 40/200" in line and "TFLOPS/GPU 0.0123" in line and "MFU 41.2%" in line
    assert "ETA 1:02:05" in line
    assert "MFU -" in summary_line(1, 2, {"mfu": None, "tflops_per_gpu": 0.1, "eta_s": 1.0})


def test_timers_and_flops_profiler_reach_the_deepspeed_config(tmp_path):
    plain = ds_config.build(_cfg(), 2)  # timers off by default: they synchronize every micro step
    assert plain["wall_clock_breakdown"] is False and "flops_profiler" not in plain
    assert ds_config.build(_cfg("train.timers=true"), 2)["wall_clock_breakdown"] is True
    assert ds_config.build(_cfg("train.timers=false"), 2)["wall_clock_breakdown"] is False
    prof = ds_config.build(_cfg("train.flops_profile_step=7"), 2, profile_dir=str(tmp_path))
    section = prof["flops_profiler"]
    assert section["enabled"] is True
    assert section["profile_step"] == 6  # DeepSpeed counts completed steps: our step 7 is its 6
    assert section["output_file"] == f"{tmp_path}/flops_step7.txt"


def test_perf_keys_leave_the_fingerprint_alone():
    from slurmtrain.common.rundir import fingerprint

    base = fingerprint(_cfg())
    assert (
        fingerprint(
            _cfg("train.timers=false", "train.flops_profile_step=3", "faults.straggler_threshold=2")
        )
        == base
    )


@pytest.mark.parametrize(
    "override",
    ["train.straggler_factor=2.0", "train.flops_profile_step=-1", "train.flops_profile_step=201"],
)
def test_bad_perf_values_name_the_key(override):
    with pytest.raises(ConfigError) as err:
        _cfg(override)
    assert override in str(err.value) and "\n" not in str(err.value)
