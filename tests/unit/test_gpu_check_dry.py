"""bench/gpu_check.py --dry: every run the GPU check starts passes slurmtrain's planner on an 80 GB
and a 141 GB card (the GiB PyTorch reports), each under a timeout, the timeouts within 450 s; the
thresholds it judges fail what falls short. No GPU, no torch: the planner in this process."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402
import gpu_check_plan as plan  # noqa: E402
import gpu_throughput  # noqa: E402


def test_every_run_fits_both_cards_and_the_timeouts_fit_the_budget(capsys):
    assert gpu_check.dry(plan.GPU, [79.1, 139.8], extras=False) == 0
    text = capsys.readouterr().out
    runs = plan.plan(plan.GPU)
    planned = [r for r in runs if r.planned]
    assert text.count("fits:") == 2 * len(planned) and "refused:" not in text, text
    assert sum(r.timeout_s for r in runs) <= plan.GPU_BUDGET_S == 450
    assert all(r.timeout_s > 0 for r in runs)
    assert f"timeouts sum {sum(r.timeout_s for r in runs)} s" in text
    # the most important rows first: the N1 check, ZeRO-2 bf16 throughput, resume
    checks = [r.check for r in runs]
    assert checks.index("n1") < checks.index("throughput") < checks.index("resume")
    assert all("train.eval_interval=0" in r.overrides for r in planned)  # no eval in a window


def test_a_card_too_small_is_refused_and_the_dry_run_fails(capsys):
    assert gpu_check.dry(plan.GPU, [60.0], extras=False) == 1
    text = capsys.readouterr().out
    assert "tp-opt1.3b" in text and "62.3 GiB/GPU > 60.0 GiB" in text
    assert "2 refused by the planner" in text  # the run and its bare twin
    # --extras (opt2.7b, the opt13b slice) is for a longer lease: past the 450 s its dry run refuses
    assert sum(r.timeout_s for r in plan.plan(plan.GPU, extras=True)) > plan.GPU_BUDGET_S


def test_thresholds_fail_what_falls_short():
    floors = {"ours_over_bare": 0.97, "mfu": plan.mfu_floor("H100-SXM", "opt1.3b")}
    assert plan.judge({"ours_over_bare": 0.99, "mfu": 0.41}, floors) == []
    missed = plan.judge({"ours_over_bare": 0.95, "mfu": None}, floors)
    assert missed == ["ours_over_bare 0.950 < 0.97", "mfu none < 0.3"]
    assert plan.mfu_floor(None, "opt1.3b") is None  # a CPU: MFU not judged
    assert plan.card_gib(85_029_158_912) == 79.1  # an H100 80GB's mem_get_info total


def test_the_timing_window_refuses_an_evaluation_inside_it(tmp_path):
    rows = [{"step": 10, "time": 100.0, "loss": 5.0}, {"step": 30, "time": 110.0, "loss": 4.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = gpu_throughput.window(tmp_path, 10, 30, tokens_per_step=1000)
    assert got["tokens_per_s"] == pytest.approx(20 * 1000 / 10.0)
    rows.insert(1, {"step": 20, "time": 105.0, "valid_loss": 5.1})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(gpu_throughput.RunFailed, match="evaluation at step 20"):
        gpu_throughput.window(tmp_path, 10, 30, tokens_per_step=1000)
