"""Local 2-rank runs: every performance field reaches metrics.jsonl and TensorBoard, a slow rank is
flagged in the ledger and offered to the bad-node ledger, and the FLOPs profiler writes its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmtrain.common.events import FlopsProfile, Started, Straggler
from tests.conftest import ledger_events, read_jsonl, run_cli, run_dirs

# train.timers=true: the forward/backward/optimizer/comm split (off by default).
FAST = [
    "train.max_steps=20",
    "train.log_interval=5",
    "checkpoint.interval_steps=0",
    "train.timers=true",
]
FIELDS = (
    "step",
    "time",
    "attempt",
    "loss",
    "lr",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "step_time",
    "time_forward",
    "time_backward",
    "time_optimizer",
    "time_comm",
    "peak_mem_bytes",
    "peak_mem_bytes_max",
)


def _train(workdir: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    done = run_cli([*FAST, *args], cwd=workdir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(workdir / "runs")
    return run


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("default"))


def test_every_logged_row_holds_every_perf_field(default_run):
    rows = read_jsonl(default_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    for row in rows:
        assert set(FIELDS) <= set(row), set(FIELDS) - set(row)
        assert row["mfu"] is None  # a CPU has no peak unless peak_tflops is given
        assert row["tflops_per_gpu"] > 0 and row["tokens_per_s_per_gpu"] == row["tokens_per_s"] / 2
        assert (
            len(row["peak_mem_bytes"]) == 2
            and row["peak_mem_bytes_max"] == max(row["peak_mem_bytes"]) > 0
        )
        split = [row[k] for k in ("time_forward", "time_backward", "time_optimizer", "time_comm")]
        assert all(isinstance(t, float) and t >= 0 for t in split)
        assert sum(split) <= row["step_time"] * 1.01  # DeepSpeed's part of the step
        assert all(not isinstance(v, dict) for v in row.values())  # flat rows


def test_deepspeed_prints_no_timer_lines(default_run):
    logs = "".join(p.read_text() for p in (default_run / "logs").glob("*_[0-9]*.*"))
    assert "step 20/20" in logs  # rank 0's summary line is there
    assert "time (ms)" not in logs  # DeepSpeed's per-step timer print is muted


def test_new_fields_reach_tensorboard(default_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [events] = (default_run / "tensorboard").glob("attempt_1")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in (
        "tokens_per_s",
        "tflops_per_gpu",
        "step_time",
        "time_forward",
        "time_backward",
        "time_optimizer",
        "time_comm",
        "peak_mem_bytes_max",
        "peak_mem_bytes/rank0",
        "peak_mem_bytes/rank1",
        "compute_time_per_rank/rank1",
        "eta_s",
    ):
        assert key in tags, key
    assert "mfu" not in tags  # null on CPU: nothing to plot
    assert [e.step for e in acc.Scalars("tflops_per_gpu")] == [5, 10, 15, 20]


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory) -> Path:
    return _train(
        tmp_path_factory.mktemp("profiled"), "peak_tflops=1.0", "train.flops_profile_step=3"
    )


def test_mfu_is_a_number_when_peak_tflops_is_given(profiled_run):
    for row in read_jsonl(profiled_run / "metrics.jsonl"):
        assert row["mfu"] == pytest.approx(row["tflops_per_gpu"] / 1.0)


def test_flops_profiler_step_writes_its_file_and_records_the_measured_flops(profiled_run):
    text = (profiled_run / "profile" / "flops_step3.txt").read_text()
    assert "DeepSpeed Flops Profiler" in text and "Profile Summary at step 3" in text
    ledger = ledger_events(profiled_run)
    [event] = [e for e in ledger if isinstance(e, FlopsProfile)]
    assert event.step == 3 and event.path.endswith("profile/flops_step3.txt")
    # The profiler's count and the analytic model count agree within a factor (they differ by
    # what each counts: elementwise ops, the attention term).
    assert 0.5 < event.flops_per_token_measured / event.flops_per_token_model < 2
    rows = read_jsonl(profiled_run / "metrics.jsonl")
    [row] = [r for r in rows if "flops_per_token_measured" in r]
    assert row["step"] == 5 and row["flops_per_token_measured"] == event.flops_per_token_measured


def test_a_slow_rank_is_flagged_as_straggler_and_offered_as_bad_node(tmp_path):
    """Stragglers by default (no train.timers): the injected slow rank's section clocks name it in
    one `straggler` row a window after the first (warm-up), and in the metrics rows."""
    inject = {"SLURMTRAIN_INJECT": "slow_rank=1,slow_factor=2"}
    args = [a for a in FAST if a != "train.timers=true"]
    done = run_cli([*args, "faults.allow_inject=true"], cwd=tmp_path, env=inject)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(tmp_path / "runs")
    ledger = ledger_events(run)
    [started] = [e for e in ledger if isinstance(e, Started)]
    flagged = [e for e in ledger if isinstance(e, Straggler)]
    assert flagged and {e.rank for e in flagged} == {1}
    assert all(e.node == started.hosts[1] and e.factor > 1.3 for e in flagged)
    assert {e.step for e in flagged} <= {10, 15, 20}  # at most one a window
    offered = read_jsonl(run / "bad_nodes.jsonl")
    assert len(offered) == len(flagged)  # advisory: no spares, so nothing is excluded
    assert all(o["node"] == started.hosts[1] and o["reason"] == "straggler" for o in offered)
    judged = [r for r in read_jsonl(run / "metrics.jsonl") if "straggler_rank" in r]
    assert judged and all(r["straggler_rank"] == 1 for r in judged)
