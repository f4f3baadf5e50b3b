"""Checkpoint interval math and the goodput simulator."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import CheckpointSaved, Started
from slurmtrain.planning import ckpt_interval

ROOT = Path(__file__).resolve().parents[2]


def test_young_daly_formula_value() -> None:
    assert ckpt_interval.young_daly_interval(60, 44_000) == pytest.approx(
        math.sqrt(2 * 60 * 44_000)
    )
    assert ckpt_interval.young_daly_interval(60, 44_000) == pytest.approx(2297.8, abs=0.1)


def test_llama3_default_rate_and_job_mtbf() -> None:
    assert ckpt_interval.LLAMA3_FAILURES_PER_NODE_DAY == pytest.approx(419 / (54 * 2048))
    # 2048 nodes reproduce Llama 3's 419 failures in 54 days.
    assert 54 * ckpt_interval.DAY / ckpt_interval.job_mtbf_seconds(2048) == pytest.approx(419)


@pytest.mark.parametrize(
    "save,restart,nodes", [(60, 300, 512), (30, 600, 2048), (300, 300, 128), (10, 60, 64)]
)
def test_young_daly_is_at_least_as_good_as_fixed_intervals_analytically(
    save, restart, nodes
) -> None:
    mtbf = ckpt_interval.job_mtbf_seconds(nodes)
    yd = ckpt_interval.interval_goodput(
        ckpt_interval.young_daly_interval(save, mtbf), save, restart, mtbf
    )
    for minutes in (10, 30, 60, 120):
        assert yd >= ckpt_interval.interval_goodput(minutes * 60, save, restart, mtbf)
    best = ckpt_interval.optimal_interval(save, restart, mtbf)
    assert yd == pytest.approx(ckpt_interval.interval_goodput(best, save, restart, mtbf), rel=2e-3)


def test_analytic_parts_sum_to_wall() -> None:
    o = ckpt_interval.analytic(1800, 60, 300, 40_000, 60 * ckpt_interval.DAY)
    assert o.useful + o.saving + o.lost + o.restarting == pytest.approx(o.wall)
    assert o.failures == pytest.approx(60 * ckpt_interval.DAY / 40_000)


def test_monte_carlo_agrees_with_analytic() -> None:
    mtbf, wall = ckpt_interval.job_mtbf_seconds(512), 60 * ckpt_interval.DAY
    taus = [600, 2300, 7200]
    for (mc, sd), tau in zip(
        ckpt_interval.monte_carlo(taus, 60, 300, mtbf, wall, trials=100, seed=1), taus
    ):
        an = ckpt_interval.analytic(tau, 60, 300, mtbf, wall)
        assert abs(mc.goodput - an.goodput) < 4 * sd / math.sqrt(100) + 0.002
        assert mc.failures == pytest.approx(an.failures, rel=0.05)


def test_replay_without_failures_commits_every_full_segment() -> None:
    o = ckpt_interval.replay(100, 10, 50, 1000, [])
    assert (o.useful, o.saving, o.lost, o.failures) == (900, 90, 0, 0)


def test_replay_failure_loses_the_open_segment_and_pays_restart() -> None:
    o = ckpt_interval.replay(100, 10, 50, 1000, [150.0])  # one segment done at 110, fail at 150
    assert o.lost == pytest.approx(40) and o.restarting == pytest.approx(50)
    assert o.useful == pytest.approx(100 + 7 * 100)  # 200..1000 holds 7 segments of 110


def test_bad_input_names_the_key() -> None:
    with pytest.raises(ConfigError, match="save_seconds=0"):
        ckpt_interval.young_daly_interval(0, 1000)
    with pytest.raises(ConfigError, match="mtbf_seconds=-1"):
        ckpt_interval.young_daly_interval(60, -1)


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
            "--intervals",
            "10,30,60,120",
            "--ckpt-cost-s",
            "60",
            "--restart-cost-s",
            "300",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split()[0] for line in out.splitlines()[6:]]
    assert rows == ["10", "30", "60", "120", "young-daly"]
    assert "job MTBF 12.37 h" in out


def test_measured_save_seconds_is_the_median_of_recent_saves() -> None:
    rows = [CheckpointSaved(seconds=s, total_seconds=2 * s) for s in (100, 10, 20, 30, 40, 50)]
    assert ckpt_interval.measured_save_seconds(rows) == 30
    assert ckpt_interval.measured_save_seconds(rows, total=True) == 60
    assert ckpt_interval.measured_save_seconds(rows, worst=True) == 50
    blocking = [CheckpointSaved(seconds=7.0)]  # a save without a published time: its seconds
    assert ckpt_interval.measured_save_seconds(blocking, total=True) == 7.0
    assert ckpt_interval.measured_save_seconds([Started(world_size=8)]) is None


# ---- hot spares ----------------------------------------------------------------------------------


def _sim():
    sys.path.insert(0, str(ROOT / "tools"))
    import goodput_sim

    return goodput_sim


class Script:
    """Scripted draws: failure gaps, spare-or-not, queue waits, repair times, and whether a failed
    node is the batch node / a lost copy's other holder (`ones`), in order."""

    def __init__(self, gaps, waits, spare=(), repairs=(), ones=()):
        self.gaps, self.waits, self.spare, self.repairs = [*gaps], [*waits], [*spare], [*repairs]
        self.ones = [*ones]

    def one_of(self, count, nodes):
        return self.ones.pop(0) if self.ones else False

    def gap(self, rate):
        return self.gaps.pop(0) if self.gaps else math.inf

    def is_spare(self, spares, nodes):
        return self.spare.pop(0) if self.spare else False

    def queue_wait(self):
        return self.waits.pop(0)

    def repair(self, mean):
        return self.repairs.pop(0)


def _model(spares, **kw):
    g = _sim()
    base = dict(nodes=10, spares=spares, wall=1000.0, rate=1e-3, interval=90.0, save=10.0)
    base.update(detect=5.0, restart_in=20.0, restart_out=50.0)
    return g.SpareModel(**{**base, **kw})


def _parts(t):
    return t.useful + t.saving + t.local_saving + t.lost + t.detecting + t.restarting + t.queued


def test_spares_no_failure_queue_then_start_up_then_segments():
    t = _sim().trial(_model(0, wall=1100.0), Script([], [100.0]))
    assert (t.queued, t.restarting, t.useful, t.saving, t.lost) == (100, 50, 810, 90, 50)
    assert _parts(t) == pytest.approx(1100)


def test_spares_a_failure_with_a_spare_restarts_inside_the_allocation():
    t = _sim().trial(_model(1), Script([280.0], [0.0]))
    # 0-50 start-up, 2 segments, failure at 280 loses 30 s; detect 5, restart 20, 6 segments
    assert (t.useful, t.saving, t.lost, t.detecting, t.restarting) == (720, 80, 125, 5, 70)
    assert (t.failures, t.in_alloc, t.requeues, t.queued) == (1, 1, 0, 0)
    assert t.spare_node_s == pytest.approx(285)  # held until it replaced the node
    assert _parts(t) == pytest.approx(1000)
    assert t.paid_goodput == pytest.approx(720 * 10 / (10 * 1000 + 285))


def test_spares_without_a_spare_the_job_goes_back_through_the_queue():
    t = _sim().trial(_model(0), Script([280.0], [0.0, 100.0]))
    assert (t.useful, t.saving, t.lost, t.queued, t.restarting) == (630, 70, 95, 100, 100)
    assert (t.failures, t.in_alloc, t.requeues) == (1, 0, 1)
    assert _parts(t) == pytest.approx(1000) and t.paid_goodput == t.goodput


def test_spares_a_failed_spare_costs_no_work_and_a_repaired_node_rejoins():
    g = _sim()
    t = g.trial(_model(1), Script([280.0], [0.0], spare=[True]))
    assert (t.failures, t.spare_failures, t.lost) == (0, 1, 50)  # only the tail: 950 = 9 x 100 + 50
    assert t.spare_node_s == pytest.approx(280)
    t = g.trial(_model(1, repair=1.0), Script([280.0, 400.0, 305.0], [0.0], repairs=[100, 100]))
    # failure at 280 uses the spare; the lost node is back at 380 and covers the failure at 685
    assert (t.failures, t.in_alloc, t.requeues, t.queued) == (2, 2, 0, 0)
    assert t.spare_node_s == pytest.approx(280 + 5 + 305 + 5 + 215)  # held, detection included
    assert _parts(t) == pytest.approx(1000)


def test_queue_wait_lognormal_hits_its_median_and_p90():
    g = _sim()
    rng = __import__("random").Random(3)
    waits = sorted(g.QueueWait(600.0, 3600.0).draw(rng) for _ in range(20_000))
    assert waits[10_000] == pytest.approx(600, rel=0.05)
    assert waits[18_000] == pytest.approx(3600, rel=0.07)


LOCAL = dict(local_interval=30.0, local_save=2.0, restart_local=15.0)  # 3 local saves a shared one


def test_local_tier_bounds_lost_work_by_its_interval():
    t = _sim().trial(_model(1, **LOCAL), Script([200.0], [0.0]))
    # start-up 0-50; a shared segment is 3 x (30 + 2) + 10 = 106 s; failure at 200 is 44 s into
    # the second one, 12 s after its first local save: 12 s lost, restart from the local tier
    assert (t.from_local, t.both_lost, t.in_alloc) == (1, 0, 1)
    assert (t.useful, t.saving, t.local_saving) == (720, 80, 48)
    assert (t.lost, t.restarting) == (12 + 70, 50 + 15)  # + the tail after the last shared save
    assert _parts(t) == pytest.approx(1000)


def test_both_local_copies_lost_falls_back_to_the_shared_tier():
    # a second failure 10 s after the first (no local save since): the failed node is the
    # replaced node's buddy (ones: not the batch node, then yes), so its two copies are gone
    t = _sim().trial(_model(2, **LOCAL), Script([200.0, 10.0], [0.0], ones=[False, False, True]))
    assert (t.from_local, t.both_lost, t.in_alloc, t.requeues) == (1, 1, 2, 0)
    assert t.lost == 12 + 32 + 18  # the second loses the local segment kept by the first
    assert t.restarting == 50 + 10 + 20  # the local restart cut short, then one from shared
    assert _parts(t) == pytest.approx(1000)


def test_batch_node_loss_ends_the_allocation_successor_or_human():
    g = _sim()
    t = g.trial(_model(2, successor_scale=0.5), Script([280.0], [0.0, 100.0], ones=[True]))
    assert (t.batch_lost, t.requeues, t.in_alloc, t.queued) == (1, 1, 0, 50)  # spares unused
    t = g.trial(_model(2, successor=False, human_wait=300.0), Script([280.0], [0.0], ones=[True]))
    assert (t.requeues, t.queued) == (1, 300)
    assert _parts(t) == pytest.approx(1000)


def test_planner_rates_are_the_bench_results():
    sys.path.insert(0, str(ROOT / "tools"))
    import goodput_costs

    from slurmtrain.planning import local_tier_plan

    rates = goodput_costs.tier_rates()
    lt = local_tier_plan
    assert (lt.LOCAL_WRITE_BPS, lt.BUDDY_COPY_BPS, lt.LOCAL_READ_BPS) == (
        rates["local_write"], rates["buddy_copy"], rates["local_read"]
    )  # fmt: skip
    assert lt.LOCAL_FIXED_S == goodput_costs.local_fixed_s()
    assert goodput_costs.io_rates()["shared_write"] == pytest.approx(446.9e6)


def test_default_cli_names_sources_best_k_and_where_the_rest_goes(capsys):
    g = _sim()
    args = ["--nodes", "512", "--days", "60", "--spares", "0,2", "--trials", "4", "--seed", "7"]
    assert g.main(args) == 0
    out = capsys.readouterr().out
    for source in ("opt13b plan", "bench/local_tier_rates.py", "bench/checkpoint_io.py", "assumed"):
        assert source in out
    best = next(line for line in out.splitlines() if line.startswith("best K = "))
    assert "per paid GPU-hour" in best and "97%" in best
    rest = next(line for line in out.splitlines() if line.startswith("where the paid"))
    parts = [float(x) for x in re.findall(r"([0-9.]+)%", rest)]
    assert sum(parts) == pytest.approx(100, abs=0.05) and "queue waits" in rest
    assert "the node-local tier at K = " in out
    with pytest.raises(SystemExit) as bad:
        g.parse_args([*args[:4], "--spares", "a"])
    assert bad.value.code == 2 and "--spares 'a'" in capsys.readouterr().err


def test_simulate_is_deterministic_per_seed():
    g = _sim()
    base, waits = _model(1, **LOCAL, wall=50_000.0, rate=2e-4), g.QueueWait(60.0, 600.0)
    once = g.simulate(base, [0, 1], waits, trials=5, seed=3)
    assert once == g.simulate(base, [0, 1], waits, trials=5, seed=3)
