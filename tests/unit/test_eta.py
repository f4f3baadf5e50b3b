"""ETA: compute time, checkpoint saves and walltime-limited attempts."""

from __future__ import annotations

import pytest

from slurmtrain.common.errors import ConfigError
from slurmtrain.planning.eta import estimate_eta, format_duration, format_eta, slurm_time_seconds

# 1M tokens a step at 100k tokens/s: 10 s a step; 1000 steps = 10,000 s of compute.
BASE = dict(
    current_step=0,
    max_steps=1000,
    tokens_per_step=1_000_000,
    tokens_per_s=100_000.0,
    restart_overhead_s=300.0,
    save_s=60.0,
    save_every_steps=100,
    signal_lead_s=120.0,
)


def test_one_attempt_when_the_work_fits_the_time_limit():
    eta = estimate_eta(**BASE, time_limit_s=4 * 3600)
    assert eta.step_time_s == pytest.approx(10.0) and eta.compute_s == pytest.approx(10_000)
    assert eta.saves == 10  # steps 100, 200, ..., 1000
    assert eta.attempts == 1  # 10,000 + 600 s of work < 14,400 - 300 - 120
    assert eta.checkpoint_s == pytest.approx(600) and eta.restart_s == pytest.approx(300)
    assert eta.total_s == pytest.approx(10_900)


def test_attempts_split_the_work_by_what_each_allocation_leaves():
    eta = estimate_eta(**BASE, time_limit_s=3600)
    # usable per attempt: 3600 - 300 restart - 120 signal lead = 3180; ceil(10,600 / 3180) = 4
    assert eta.attempts == 4
    assert eta.checkpoint_s == pytest.approx(600 + 3 * 60)  # + the save each requeue forces
    assert eta.total_s == pytest.approx(10_600 + 3 * 60 + 4 * 300)


def test_async_saves_block_briefly_but_the_time_limit_save_is_synchronous():
    eta = estimate_eta(**{**BASE, "save_s": 5.0}, time_limit_s=3600, signal_save_s=200.0)
    # usable per attempt: 3600 - 300 restart - 200 (the signal's save outlasts the lead) = 3100
    assert eta.attempts == 4  # ceil((10,000 + 10 x 5) / 3100)
    assert eta.checkpoint_s == pytest.approx(10 * 5 + 3 * 200)


def test_resuming_counts_only_what_is_left():
    eta = estimate_eta(**{**BASE, "current_step": 950}, time_limit_s=3600)
    assert eta.remaining_steps == 50 and eta.saves == 1 and eta.attempts == 1
    done = estimate_eta(**{**BASE, "current_step": 1000}, time_limit_s=3600)
    assert done.remaining_steps == 0 and done.attempts == 0 and done.total_s == 0
    assert format_eta(done).startswith("ETA 0s")


def test_final_save_is_counted_once_and_time_intervals_combine():
    eta = estimate_eta(**{**BASE, "max_steps": 250})
    assert eta.saves == 3  # 100, 200 and the final 250
    assert estimate_eta(**{**BASE, "max_steps": 250}, save_final=False).saves == 2
    # 10 s steps: every 300 s is every 30 steps, sooner than every 100
    assert estimate_eta(**{**BASE, "max_steps": 300}, save_every_s=300).saves == 10


def test_no_time_limit_is_one_attempt():
    eta = estimate_eta(**BASE, time_limit_s=None)
    assert eta.attempts == 1 and "no time limit" in format_eta(eta)


def test_a_limit_too_short_for_restart_and_save_is_a_config_error():
    with pytest.raises(ConfigError, match="cluster.time"):
        estimate_eta(**BASE, time_limit_s=400)


def test_bad_throughput_is_a_config_error():
    with pytest.raises(ConfigError, match="tokens_per_s"):
        estimate_eta(**{**BASE, "tokens_per_s": 0.0})


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 1800),
        ("30:15", 1815),
        ("01:00:00", 3600),
        ("2-12", 216_000),
        ("2-12:30", 217_800),
        ("1-00:00:10", 86_410),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_slurm_time_formats(text, seconds):
    assert slurm_time_seconds(text) == seconds


def test_bad_slurm_time_names_the_key():
    with pytest.raises(ConfigError, match=r"cluster.time='4h'"):
        slurm_time_seconds("4h")


def test_formatting():
    assert [format_duration(s) for s in (45, 200, 18_720, 183_600)] == [
        "45s",
        "3m20s",
        "5h12m",
        "2d03h",
    ]
    line = format_eta(estimate_eta(**BASE, time_limit_s=3600))
    assert line == (
        "ETA 3h19m: 1000 steps x 10.00 s = 2h46m; 4 attempts of 1h00m, restarts "
        "20m00s; 10 saves, checkpoints 13m00s"
    )
