"""Checkpoint interval math and the goodput simulator."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtrain.common.errors import ConfigError
from slurmtrain.planning import ckpt_interval as ci

ROOT = Path(__file__).resolve().parents[2]


def test_young_daly_formula_value() -> None:
    assert ci.young_daly_interval(60, 44_000) == pytest.approx(math.sqrt(2 * 60 * 44_000))
    assert ci.young_daly_interval(60, 44_000) == pytest.approx(2297.8, abs=0.1)


def test_llama3_default_rate_and_job_mtbf() -> None:
    assert ci.LLAMA3_FAILURES_PER_NODE_DAY == pytest.approx(419 / (54 * 2048))
    # 2048 nodes reproduce Llama 3's 419 failures in 54 days.
    assert 54 * ci.DAY / ci.job_mtbf_seconds(2048) == pytest.approx(419)


@pytest.mark.parametrize(
    "save,restart,nodes", [(60, 300, 512), (30, 600, 2048), (300, 300, 128), (10, 60, 64)]
)
def test_young_daly_is_at_least_as_good_as_fixed_intervals_analytically(
    save, restart, nodes
) -> None:
    mtbf = ci.job_mtbf_seconds(nodes)
    yd = ci.interval_goodput(ci.young_daly_interval(save, mtbf), save, restart, mtbf)
    for minutes in (10, 30, 60, 120):
        assert yd >= ci.interval_goodput(minutes * 60, save, restart, mtbf)
    best = ci.optimal_interval(save, restart, mtbf)
    assert yd == pytest.approx(ci.interval_goodput(best, save, restart, mtbf), rel=2e-3)


def test_analytic_parts_sum_to_wall() -> None:
    o = ci.analytic(1800, 60, 300, 40_000, 60 * ci.DAY)
    assert o.useful + o.saving + o.lost + o.restarting == pytest.approx(o.wall)
    assert o.failures == pytest.approx(60 * ci.DAY / 40_000)


def test_monte_carlo_agrees_with_analytic() -> None:
    mtbf, wall = ci.job_mtbf_seconds(512), 60 * ci.DAY
    taus = [600, 2300, 7200]
    for (mc, sd), tau in zip(ci.monte_carlo(taus, 60, 300, mtbf, wall, trials=100, seed=1), taus):
        an = ci.analytic(tau, 60, 300, mtbf, wall)
        assert abs(mc.goodput - an.goodput) < 4 * sd / math.sqrt(100) + 0.002
        assert mc.failures == pytest.approx(an.failures, rel=0.05)


def test_replay_without_failures_commits_every_full_segment() -> None:
    o = ci.replay(100, 10, 50, 1000, [])
    assert (o.useful, o.saving, o.lost, o.failures) == (900, 90, 0, 0)


def test_replay_failure_loses_the_open_segment_and_pays_restart() -> None:
    o = ci.replay(100, 10, 50, 1000, [150.0])  # one segment done at 110, fail at 150
    assert o.lost == pytest.approx(40) and o.restarting == pytest.approx(50)
    assert o.useful == pytest.approx(100 + 7 * 100)  # 200..1000 holds 7 segments of 110


def test_bad_input_names_the_key() -> None:
    with pytest.raises(ConfigError, match="save_seconds=0"):
        ci.young_daly_interval(0, 1000)
    with pytest.raises(ConfigError, match="mtbf_seconds=-1"):
        ci.young_daly_interval(60, -1)


def test_cli_prints_a_row_per_interval_and_young_daly() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "goodput_sim.py"),
            "--nodes",
            "512",
            "--days",
            "60",
            "--trials",
            "20",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split()[0] for line in out.splitlines()[6:]]
    assert rows == ["10", "30", "60", "120", "young-daly"]
    assert "job MTBF 12.37 h" in out


def test_measured_save_seconds_is_the_median_of_recent_saves() -> None:
    rows = [{"event": "checkpoint_saved", "seconds": s} for s in (100, 10, 20, 30, 40, 50)]
    assert ci.measured_save_seconds(rows) == 30
    assert ci.measured_save_seconds([{"event": "started"}]) is None
