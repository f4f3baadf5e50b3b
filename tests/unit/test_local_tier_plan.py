"""`checkpoint.local_every_steps=auto`: planned at login from the local save's measured cost and
the job's failure rate on GPUs with 2+ nodes, shown in the plan with its reason; 0 on one node and
on CPU ranks (their runs unchanged); a bad value is one line naming the key and the fix."""

from __future__ import annotations

import pytest

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.rundir import fingerprint
from slurmtrain.planning import ckpt_interval, local_tier_plan, policy, preflight
from tests.plans import plan_line, planned

pytestmark = pytest.mark.usefixtures("no_slurm")
HEADLINE = ["model=opt13b", "nodes=64", "gpus_per_node=8", "cluster=slurm", "dry_run=true"]


SHARED_HOURLY = ("checkpoint.interval_steps=0", "checkpoint.interval_minutes=600")


def test_multi_node_gpu_runs_get_young_daly_steps_of_the_local_save(tmp_path):
    cfg = planned(tmp_path, *HEADLINE, *SHARED_HOURLY)  # shared saves 10 h apart
    ckpt = policy.checkpoints(cfg, 64)
    save = local_tier_plan.local_save_seconds(ckpt.layout.save.node)
    tau = ckpt_interval.young_daly_interval(save, ckpt.mtbf_s)
    assert ckpt.step_s and cfg.checkpoint.local_every_steps == max(1, round(tau / ckpt.step_s))
    line = plan_line(preflight.report(cfg), "plan: node-local checkpoints every")
    assert "auto: Young/Daly" in line and local_tier_plan.RATES_SOURCE in line
    assert local_tier_plan.FIXED_SOURCE in line


def test_a_local_interval_no_shorter_than_the_shared_one_is_off_and_says_why(tmp_path):
    cfg = planned(
        tmp_path, *HEADLINE, "checkpoint.interval_steps=0", "checkpoint.interval_minutes=1"
    )
    assert cfg.checkpoint.local_every_steps == 0
    line = plan_line(preflight.report(cfg), "plan: node-local checkpoints off")
    assert "no shorter than the shared tier's 1.0 min" in line and "Young/Daly" in line


def test_one_node_and_cpu_ranks_keep_the_shared_tier_only(tmp_path):
    one = planned(tmp_path, "model=opt13b", "nodes=1", "gpus_per_node=8", "dry_run=true")
    assert one.checkpoint.local_every_steps == 0
    assert "node-local" not in preflight.report(one).text
    cpu = planned(tmp_path, "model=opt_tiny", "nodes=2", "gpus_per_node=0", "cluster=slurm")
    assert cpu.checkpoint.local_every_steps == 0


def test_a_value_set_by_hand_wins_and_is_said_so(tmp_path):
    cfg = planned(tmp_path, *HEADLINE, *SHARED_HOURLY, "checkpoint.local_every_steps=7")
    assert cfg.checkpoint.local_every_steps == 7
    assert "set by hand" in plan_line(preflight.report(cfg), "plan: node-local checkpoints")
    off = planned(tmp_path, *HEADLINE, *SHARED_HOURLY, "checkpoint.local_every_steps=0")
    assert "off" in plan_line(preflight.report(off), "plan: node-local checkpoints")
    assert fingerprint(off) == fingerprint(cfg)  # where copies go is not what is computed


def test_a_bad_value_is_one_line_naming_key_and_fix(tmp_path):
    for bad in ("soon", "-1"):
        with pytest.raises(ConfigError) as err:
            planned(tmp_path, *HEADLINE, f"checkpoint.local_every_steps={bad}")
        text = str(err.value)
        assert "checkpoint.local_every_steps=" in text and "auto" in text and "\n" not in text
