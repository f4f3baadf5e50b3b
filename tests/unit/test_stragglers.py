"""Straggler scoring (compute/observe/stragglers.py): ratios to the median rank and to a rank's own
past, a node's score is its slowest rank's, one row per window, chronic after M windows in a row."""

from __future__ import annotations

import json
import os

import pytest
import torch
from omegaconf import OmegaConf

from slurmtrain.common import events, schema

os.environ.setdefault("DS_ACCELERATOR", "cpu")
strag = pytest.importorskip("slurmtrain.compute.observe.stragglers")

HOSTS = ["n1", "n1", "n2", "n2"]


def test_scores_are_ratios_to_the_median_rank_and_to_the_rank_own_past():
    assert strag.rank_scores([1.0, 1.0, 1.5, 1.0]) == [1.0, 1.0, 1.5, 1.0]
    assert strag.rank_scores([0.0, 0.0]) == [1.0, 1.0] and strag.rank_scores([3.0]) == [1.0]
    assert strag.rank_scores([1.0, 2.0]) == [0.5, 2.0]  # the others' median: 2 ranks say 2x
    assert strag.rank_scores([4.0, 1.0, 2.0]) == [4 / 1.5, 1 / 3, 2 / 2.5]
    assert strag.history_score(2.0, [1.0, 1.0, 4.0]) == 2.0
    assert strag.history_score(2.0, []) == 1.0


def test_a_node_scores_as_its_slowest_rank():
    nodes = strag.node_scores([1.0, 1.1, 1.6, 0.9], HOSTS)
    assert nodes == {"n1": (1.1, 1), "n2": (1.6, 2)}


def test_the_slowest_node_above_the_threshold_is_judged_chronic_after_m_windows_in_a_row():
    streaks = strag.Streaks(threshold=1.2, windows=3)
    past: list[list[float]] = [[], [], [], []]
    slow = [1.0, 1.0, 1.0, 1.5]
    first = strag.judge(slow, HOSTS, past, streaks)
    assert first == strag.Verdict("n2", 3, 1.5, 1.0, 1, False)
    assert strag.judge(slow, HOSTS, past, streaks).windows == 2
    third = strag.judge(slow, HOSTS, past, streaks)
    assert third.chronic and third.new and third.windows == 3
    fourth = strag.judge(slow, HOSTS, past, streaks)
    assert fourth.chronic and not fourth.new  # it stays chronic; it became so once


def test_a_quiet_window_breaks_the_streak_and_a_clean_run_is_never_judged():
    streaks = strag.Streaks(threshold=1.2, windows=3)
    past: list[list[float]] = [[]] * 4
    noisy = [[1.0, 1.0, 1.0, 1.3], [1.0, 1.0, 1.0, 1.3], [1.0, 1.1, 1.0, 1.0]]
    verdicts = [strag.judge(w, HOSTS, past, streaks) for w in noisy * 3]
    assert all(v is None or not v.chronic for v in verdicts)
    assert [v.windows if v else 0 for v in verdicts[:3]] == [1, 2, 0]
    assert strag.judge([1.0, 1.05, 0.97, 1.1], HOSTS, past, streaks) is None


def _cfg(**faults: object):
    cfg = OmegaConf.structured(schema.RootConfig)
    for key, value in faults.items():
        cfg.faults[key] = value
    return cfg


def test_exclusion_defaults_to_whether_the_run_has_spares():
    assert not strag.exclude_stragglers(_cfg())
    assert strag.exclude_stragglers(_cfg(spare_nodes=1))
    assert not strag.exclude_stragglers(_cfg(spare_nodes=1, exclude_stragglers=False))
    assert strag.exclude_stragglers(_cfg(exclude_stragglers=True))


def test_the_watch_writes_one_row_a_window_and_a_chronic_node_to_the_bad_node_ledger(tmp_path):
    rows: list[events.Row] = []
    bad = tmp_path / "bad_nodes.jsonl"
    cfg = _cfg(exclude_stragglers=True, straggler_windows=3, straggler_threshold=1.2)
    watch = strag.Watch(cfg, HOSTS, rows.append, bad)
    slow = [[0.01, 0.1, 0.2, 0.01, 0.11]] * 3 + [[0.01, 0.15, 0.2, 0.01, 0.16]]  # rank 3: 1.5x
    assert watch.window(5, slow) == {}  # the first window warms up
    fields = [watch.window(step, slow) for step in (10, 15, 20)]
    assert fields[-1]["straggler_rank"] == 3 and fields[-1]["straggler_score"] > 1.4
    assert [(r.node, r.rank, r.windows, r.chronic) for r in rows] == [
        ("n2", 3, 1, None),
        ("n2", 3, 2, None),
        ("n2", 3, 3, True),
    ]
    assert all(isinstance(r, events.Straggler) and r.factor > 1.4 for r in rows)
    offered = [json.loads(line) for line in bad.read_text().splitlines()]
    assert [o["reason"] for o in offered] == [
        events.Straggler.kind,
        events.Straggler.kind,
        events.Straggler.kind,
        strag.CHRONIC,
    ]


@pytest.mark.parametrize(("allocated", "replaced"), [("3", True), ("2", False), (None, False)])
def test_a_chronic_straggler_stops_the_attempt_at_once_when_a_spare_is_idle(
    tmp_path, monkeypatch, allocated, replaced
):
    """Issue 39: with a spare idle in the allocation (Slurm's node count above the attempt's), the
    chronic verdict asks rank 0's flags for a saved stop that exits EXIT_BAD_NODE (the supervisor
    restarts inside the allocation, the node excluded); without one the next attempt leaves it out."""
    from slurmtrain.common.errors import EXIT_BAD_NODE
    from slurmtrain.compute.faults import signals

    if allocated is None:
        monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    else:
        monkeypatch.setenv("SLURM_JOB_NUM_NODES", allocated)
    flags = signals.SignalFlags()
    cfg = _cfg(spare_nodes=1, straggler_windows=2, straggler_threshold=1.2)
    watch = strag.Watch(cfg, HOSTS, lambda row: None, tmp_path / "bad_nodes.jsonl")
    watch.replace = flags.replace_node
    slow = [[0.01, 0.1, 0.2, 0.01, 0.11]] * 3 + [[0.01, 0.15, 0.2, 0.01, 0.16]]
    for step in (5, 10, 15, 20):
        watch.window(step, slow)
    assert flags.code == (signals.REPLACE_NODE if replaced else signals.NONE)
    assert signals.EXIT_CODES[signals.REPLACE_NODE] == EXIT_BAD_NODE


def test_a_signal_outranks_a_replacement_and_a_replacement_never_downgrades_a_signal():
    import signal as os_signal

    from slurmtrain.compute.faults import signals

    flags = signals.SignalFlags()
    flags.replace_node()
    flags._handler(os_signal.SIGUSR2, None)  # the time limit wins: the ranks agree on the max
    assert flags.code == signals.TIME_LIMIT > signals.REPLACE_NODE
    flags.replace_node()
    assert flags.code == signals.TIME_LIMIT


def test_the_cpu_section_clock_counts_each_section_per_micro_step_and_slows_on_cue(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(strag, "spin", slept.append)  # what an injected slowdown asks for
    clock = strag.Sections(torch.device("cpu"))
    slowed = strag.Sections(torch.device("cpu"), slow=3.0)
    for c in (clock, slowed):
        for _ in range(2):
            c.start()
            for section in range(len(strag.SECTIONS)):
                sum(range(20_000))  # the section's work
                c.lap(section)
    taken = clock.take()
    assert all(t > 0 for t in taken) and clock.take() == [0.0] * 5
    assert taken[strag.SCORED] > 0  # the median micro step's data+forward CPU time
    # forward and backward of each of the 2 micro steps: twice the section's own time
    assert len(slept) == 4 and all(s > 0 for s in slept)


def test_status_names_the_newest_straggler_node_with_its_score_and_rank():
    from slurmtrain.cli.status_table import straggler_line

    rows = [
        events.Straggler(node="n1", rank=0, factor=1.3, step=10),
        events.Straggler(node="n2", rank=3, factor=1.5, step=20, windows=3, chronic=True),
    ]
    assert straggler_line([]) is None
    assert straggler_line(rows[:1]) == "straggler: node n1 1.30x (rank 0)"
    assert straggler_line(rows) == "straggler: node n2 1.50x (rank 3), chronic"


def test_report_lists_each_straggler_node_slowest_first():
    from slurmtrain.cli.report_stragglers import node_panel

    rows = [
        events.Straggler(node="n1", rank=0, factor=1.3, step=10),
        events.Straggler(node="n2", rank=3, factor=1.5, step=20),
        events.Straggler(node="n2", rank=3, factor=1.4, step=30, chronic=True, excluded=True),
    ]
    assert node_panel([]) == []
    assert node_panel(rows)[1:] == [
        "  n2  2 windows  worst 1.50x (rank 3)  chronic, excluded",
        "  n1  1 windows  worst 1.30x (rank 0)",
    ]


def test_status_says_which_attempt_an_older_straggler_was_in():
    from slurmtrain.cli.status_table import straggler_line

    rows = [
        events.Started(attempt=1),
        events.Straggler(node="n7", rank=0, factor=1.45, attempt=1, chronic=True, excluded=True),
        events.Started(attempt=2),
    ]
    assert straggler_line(rows) == (
        "straggler: node n7 1.45x (rank 0) in attempt 1, chronic, excluded next attempt"
    )


def test_the_next_attempt_excludes_a_chronic_straggler_not_an_advisory_one():
    from slurmtrain.batch.exclusions import active

    now = 1000.0
    rows = [
        {"node": "n1", "reason": events.Straggler.kind, "time": now},
        {"node": "n2", "reason": strag.CHRONIC, "time": now},
    ]
    assert list(active(rows, hours=24, now=now)) == ["n2"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_the_cuda_section_clock_reads_only_events_the_device_passed():
    clock = strag.Sections(torch.device("cuda"))
    x = torch.randn(512, 512, device="cuda")
    for _ in range(3):
        clock.start()
        for section in range(len(strag.SECTIONS)):
            x = x @ x / 512
            clock.lap(section)
    torch.cuda.synchronize()  # the test's own: the loop's next window comes later
    taken = clock.take()
    assert taken[strag.FORWARD] > 0 and not clock.pending
    assert taken[strag.SCORED] == taken[strag.DATA] + taken[strag.FORWARD]
