"""The headline plan (opt13b, 64 nodes x 8 GPUs) as a large-model engineer would set it up:
phase deadlines in minutes, the checkpoint interval from Young/Daly with its cost, async saves on
GPUs, the time limit from the partition's MaxTime, attempts and restart cost. No Slurm here: the
partition is passed in as a PartitionInfo, as `scontrol show partition` would give it."""

from __future__ import annotations

import re
from typing import Optional

import pytest

from slurmtrain.common import schema
from slurmtrain.common.rundir import fingerprint
from slurmtrain.common.slurm_text import PartitionInfo
from slurmtrain.login.prepare import resolve
from slurmtrain.planning import preflight
from tests.plans import composed, planned

schema.register()
HEADLINE = ["model=opt13b", "nodes=64", "gpus_per_node=8", "cluster=slurm", "dry_run=true"]
MIN = 60.0


pytestmark = pytest.mark.usefixtures("no_slurm")


def _headline(tmp_path, *extra: str):
    return planned(tmp_path, *HEADLINE, *extra)


def _partition(max_time_s: Optional[int]) -> PartitionInfo:
    return PartitionInfo(
        name="gpu",
        nodes="g[001-128]",
        node_names=(),
        total_nodes=128,
        max_nodes=None,
        max_time_s=max_time_s,
        default_time_s=3600,
        default=True,
        state="UP",
        priority_tier=1,
        preempt_mode="OFF",
        grace_time_s=0,
        total_cpus=128 * 96,
        gpus=128 * 8,
    )


def _minutes(text: str, name: str) -> float:
    """`name 6.4 min` in the plan's deadlines line -> 6.4."""
    line = next(ln for ln in text.splitlines() if ln.startswith("plan: deadlines"))
    m = re.search(rf"\b{re.escape(name)} (\d+(?:\.\d+)?) min\b", line)
    assert m, f"no '{name} N min' in {line!r}"
    return float(m[1])


# ---- deadlines -------------------------------------------------------------------------------


def test_the_headline_plan_prints_every_phase_deadline_in_minutes(tmp_path):
    text = preflight.report(_headline(tmp_path)).text
    for phase in ("save", "verify", "load", "build", "convert"):
        assert 1 <= _minutes(text, phase) < 60, (phase, text)
    # the save: sum of the shards (+ the module once) at 1 GB/s x 64 nodes, the busiest node
    # (rank 0's module file) bounding it: ~30 s planned, 5 min floor + 3 x that
    assert _minutes(text, "save") < 10


# ---- the checkpoint interval ------------------------------------------------------------------


def test_the_headline_interval_is_young_daly_in_minutes_with_its_cost(tmp_path):
    from slurmtrain.planning import ckpt_interval, policy

    cfg = _headline(tmp_path)
    plan = policy.checkpoints(cfg, 64)
    mtbf = cfg.faults.node_mtbf_h * 3600 / 64  # any of 64 nodes failing stops the job
    assert plan.mtbf_s == pytest.approx(mtbf)
    assert plan.interval_s == pytest.approx(
        ckpt_interval.young_daly_interval(plan.save_s, mtbf), rel=1e-6
    )
    assert 30 * MIN < plan.interval_s < 3 * 3600  # "1-2 h between saves at this size"
    # saved by time (robust to a wrong MFU guess); never by steps unless set by hand
    assert cfg.checkpoint.interval_steps == 0
    assert cfg.checkpoint.interval_minutes == round(plan.interval_s / MIN)
    text = preflight.report(cfg).text
    line = next(ln for ln in text.splitlines() if ln.startswith("plan: checkpoints"))
    assert f"every {round(plan.interval_s / MIN)} min" in line
    assert "Young/Daly" in line and "% of wall time" in line
    cost = re.search(r"cost (\d+\.\d)% of wall time", line)
    assert cost and 0 < float(cost[1]) < 5, line
    for part in ("saves", "lost work", "restarts"):
        assert part in line
    assert "checkpoints 0s" not in text and "restarts 0s" not in text
    assert "2861 saves" not in text


def test_the_node_mtbf_default_is_llama3_s_published_rate():
    from slurmtrain.common.schema import FaultsConfig
    from slurmtrain.planning import ckpt_interval

    rate = ckpt_interval.LLAMA3_FAILURES_PER_NODE_DAY  # 419 in 54 days on 2,048 nodes
    assert FaultsConfig().node_mtbf_h == pytest.approx(24 / rate, rel=1e-3)


def test_async_saves_are_on_by_default_on_gpus_and_off_on_cpus(tmp_path):
    assert _headline(tmp_path).checkpoint.async_save is True
    assert "async" in preflight.report(_headline(tmp_path)).text
    cpu = resolve(composed(tmp_path, "cluster=local", "dry_run=true"))
    assert cpu.checkpoint.async_save is False
    assert _headline(tmp_path, "checkpoint.async_save=false").checkpoint.async_save is False


def test_an_interval_set_by_hand_wins_and_cpu_runs_keep_today_s_default(tmp_path):
    cfg = _headline(tmp_path, "checkpoint.interval_steps=500")
    assert (cfg.checkpoint.interval_steps, cfg.checkpoint.interval_minutes) == (500, 0)
    line = next(
        ln for ln in preflight.report(cfg).text.splitlines() if ln.startswith("plan: checkpoints")
    )
    assert "checkpoint.interval_steps=500" in line and "Young/Daly" in line
    by_time = _headline(tmp_path, "checkpoint.interval_minutes=30")
    assert (by_time.checkpoint.interval_steps, by_time.checkpoint.interval_minutes) == (0, 30)
    cpu = resolve(composed(tmp_path, "cluster=local", "dry_run=true"))
    assert (cpu.checkpoint.interval_steps, cpu.checkpoint.interval_minutes) == (25, 0)


def test_the_interval_follows_the_measured_save_time_once_the_ledger_has_one(tmp_path):
    from slurmtrain.common.events import CheckpointSaved
    from slurmtrain.planning import policy

    cfg = _headline(tmp_path)
    planned = policy.checkpoints(cfg, 64)
    slow = [CheckpointSaved(seconds=4.0, total_seconds=4 * planned.save_s)]
    measured = policy.checkpoints(cfg, 64, slow)
    assert measured.save_how == "measured" and measured.save_s == pytest.approx(4 * planned.save_s)
    assert measured.interval_s == pytest.approx(2 * planned.interval_s, rel=1e-6)  # sqrt(4)


# ---- the time limit ----------------------------------------------------------------------------


def test_the_time_limit_is_the_partition_s_max_time_capped_at_48_hours():
    from slurmtrain.planning import policy

    cap = "48:00:00"
    assert policy.time_limit("auto", cap, _partition(24 * 3600))[0] == "1-00:00:00"
    assert policy.time_limit("auto", cap, _partition(7 * 86400))[0] == "2-00:00:00"
    assert policy.time_limit("auto", cap, _partition(None))[0] == "2-00:00:00"  # UNLIMITED
    value, note = policy.time_limit("auto", cap, None, "SLURMTRAIN_AUTO=off")
    assert value == "2-00:00:00" and "partition unknown" in note and "time_cap" in note
    assert policy.time_limit("04:00:00", cap, _partition(24 * 3600))[0] == "04:00:00"  # by hand


def test_the_plan_uses_the_partition_s_max_time_and_shows_attempts_and_restart_cost(tmp_path):
    from slurmtrain.planning import policy

    cfg = composed(tmp_path, *HEADLINE)
    note = policy.resolve_time(cfg, _partition(24 * 3600))
    assert cfg.cluster.time == "1-00:00:00" and "MaxTime" in note
    cfg = resolve(cfg)
    text = preflight.report(cfg).text
    eta = next(ln for ln in text.splitlines() if ln.startswith("plan: ETA"))
    attempts = int(re.search(r"(\d+) attempts? of 1d00h", eta)[1])
    assert 1 <= attempts <= 3, eta  # not 35 one-hour trips through the queue
    restarts = re.search(r"restarts (\S+?);", eta)[1]
    assert restarts != "0s" and "m" in restarts, eta
    unknown = preflight.report(_headline(tmp_path)).text
    assert "cluster.time=2-00:00:00" in unknown and "partition unknown" in unknown


def test_a_time_set_by_hand_wins(tmp_path):
    assert _headline(tmp_path, "cluster.time=01:00:00").cluster.time == "01:00:00"


def test_a_time_planned_without_the_partition_is_planned_again_from_it(tmp_path):
    # Detection off: `auto` became the cap; the partition the job goes to then allows 2 h only.
    from slurmtrain.planning import policy

    cfg = _headline(tmp_path)
    assert cfg.cluster.time == "2-00:00:00"
    policy.replan_time(cfg, _partition(2 * 3600))
    assert cfg.cluster.time == "02:00:00" and "MaxTime" in cfg.cluster.time_from
    by_hand = _headline(tmp_path, "cluster.time=04:00:00")
    policy.replan_time(by_hand, _partition(2 * 3600))
    assert by_hand.cluster.time == "04:00:00"  # refused later against MaxTime, never changed


# ---- nothing else moves ------------------------------------------------------------------------


def test_the_new_keys_do_not_change_a_run_s_fingerprint(tmp_path):
    base = _headline(tmp_path)
    for extra in (
        "cluster.time=01:00:00",
        "cluster.time_cap=12:00:00",
        "faults.node_mtbf_h=100",
        "checkpoint.interval_steps=25",
        "checkpoint.async_save=false",
    ):
        assert fingerprint(_headline(tmp_path, extra)) == fingerprint(base), extra


def test_bad_policy_keys_are_one_line_naming_key_and_fix(tmp_path):
    from slurmtrain.common.errors import ConfigError

    for arg, named in (
        ("faults.node_mtbf_h=0", "faults.node_mtbf_h=0"),
        ("cluster.time_cap=4h", "cluster.time_cap='4h'"),
        ("checkpoint.interval_steps=soon", "checkpoint.interval_steps='soon'"),
        ("checkpoint.async_save=maybe", "checkpoint.async_save='maybe'"),
    ):
        with pytest.raises(ConfigError) as err:
            _headline(tmp_path, arg)
        assert named in str(err.value) and "\n" not in str(err.value), arg
