"""The host memory plan: what a node's ranks really hold in host memory (issue 32, Why 3).

ZeRO 0-2 build the model on the GPU in the training dtype and ZeRO-3 under zero.Init
(compute/model.py), so no rank holds an fp32 copy of the model on the host; async saves pin one host
copy of each rank's saved state (compute/checkpoint/hostpool.py). The headline opt13b ZeRO-2 plan
on 64 x 8 GPUs needs a few GiB of host memory per node, not 575 GiB.
"""

from __future__ import annotations

import pytest

from slurmtrain.planning import memory, preflight
from tests.plans import planned

HEADLINE = ["model=opt13b", "nodes=64", "gpus_per_node=8", "cluster=local", "dry_run=true"]


pytestmark = pytest.mark.usefixtures("no_slurm")


def _cfg(tmp_path, *extra: str):
    return planned(tmp_path, *HEADLINE, *extra)


def test_512_gib_hosts_accept_the_opt13b_zero2_plan_that_fits(tmp_path):
    report = preflight.report(_cfg(tmp_path, "cluster.cpu_mem_gb=512"))
    assert report.misfit is None, report.misfit
    assert any(ln.startswith("plan: fits") for ln in report.lines), report.text


def test_the_host_plan_counts_the_pinned_save_copies_not_an_fp32_build(tmp_path):
    plan = preflight.memory_plan(_cfg(tmp_path), 64)
    p = plan.num_params
    # one pinned copy per rank of its saved shard (fp32 master + Adam moments: 12 bytes / param)
    pinned = 8 * 12 * p / 512
    assert plan.host_pinned == pytest.approx(pinned, rel=0.01)
    assert plan.cpu_per_node < 0.1 * 4 * p * 8  # nowhere near 8 fp32 copies of the model
    assert plan.cpu_per_node >= plan.host_pinned
    sync = preflight.memory_plan(_cfg(tmp_path, "checkpoint.async_save=false"), 64)
    assert sync.host_pinned == 0 and sync.cpu_per_node < plan.cpu_per_node


def test_a_pretrained_start_loads_in_the_training_dtype_on_the_host():
    shape = memory.OPT_SIZES["opt13b"]
    fresh = memory.plan_memory(shape, nodes=64, gpus_per_node=8, micro_batch=2)
    loaded = memory.plan_memory(shape, nodes=64, gpus_per_node=8, micro_batch=2, pretrained=True)
    bf16_copies = 8 * 2 * fresh.num_params  # each rank reads the weights in bf16, then moves them
    assert loaded.cpu_per_node - fresh.cpu_per_node == pytest.approx(bf16_copies, rel=0.01)


def test_a_host_that_really_is_too_small_is_refused_in_one_line_naming_key_value_and_fix(
    tmp_path,
):
    report = preflight.report(_cfg(tmp_path, "cluster.cpu_mem_gb=8"))
    assert report.misfit is not None
    line = report.misfit
    assert "\n" not in line and "(fits)" not in line, line
    assert "cluster.cpu_mem_gb=8" in line and "host" in line, line
    assert "async_save=false" in line or "nodes" in line, line  # a fix is named


def test_an_offload_plan_over_the_host_is_refused_with_the_host_figure(tmp_path):
    cfg = _cfg(tmp_path, "deepspeed.offload_optimizer=true", "nodes=1", "cluster.cpu_mem_gb=64")
    report = preflight.report(cfg)
    assert report.misfit is not None and "(fits)" not in report.misfit
    assert "cluster.cpu_mem_gb=64" in report.misfit, report.misfit
