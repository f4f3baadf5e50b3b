"""The ledger vocabulary (common/events.py): one failure-class table, one class per kind, rows
unchanged on disk, old and odd rows read by one tolerant parser (common/row_codec.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Iterator

from slurmtrain.cli import report
from slurmtrain.common import errors, events, jsonl, ledger, schema
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]


class _Axes:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def axvline(self, x: float, **style: object) -> None:
        self.lines.append(style)


def test_every_failure_class_has_its_own_report_colour() -> None:
    """A `failed` row of any class is drawn in a colour of its own, never the unknown grey."""
    rows = [events.Failed(time=1.0 + i, cls=c) for i, c in enumerate(FailureClass)]
    ax = _Axes()
    report._markers([ax], rows, 0.0, 1.0)
    colours = [line["color"] for line in ax.lines]
    assert len(colours) == len(FailureClass)
    assert "#7f7f7f" not in colours  # the grey an unknown class gets
    assert len(set(colours)) == len(colours)


def test_budgeted_classes_have_their_budget_key() -> None:
    faults = schema.FaultsConfig()
    for cls in events.FAILURE_CLASSES:
        assert isinstance(getattr(faults, events.budget_key(cls)), int), cls
    assert set(ledger.budgets(faults)) == set(events.FAILURE_CLASSES)
    assert FailureClass.cancelled not in events.FAILURE_CLASSES


def test_durable_kinds_are_the_fate_events() -> None:
    assert jsonl.FATE_EVENTS == {k for k, c in events.REGISTRY.items() if c.durable}
    assert events.AttemptEnded.durable and "attempt_ended" in jsonl.FATE_EVENTS
    assert not events.Startup.durable and "startup" not in jsonl.FATE_EVENTS


# Words the ledger's kinds share with other vocabularies: run states (status), goodput's parts,
# tracker outcomes, a bad node's reason, sbatch's --signal, a watchdog phase, an injected fault.
OTHER_VOCABULARIES = {
    ("batch/exclusions.py", "straggler"),
    ("batch/exclusions.py", "failed"),
    ("cli/goodput.py", "startup"),
    ("cli/report.py", "startup"),
    ("cli/status_select.py", "stopped"),
    ("cli/status_select.py", "finished"),
    ("cli/status_select.py", "failed"),
    ("common/rundir.py", "finished"),
    ("common/rundir.py", "stopped"),
    ("compute/checkpoint/beats.py", "startup"),
    ("compute/faults/inject.py", "bad_node"),
    ("compute/observe/tracker_backends.py", "finished"),
    ("compute/observe/tracker_backends.py", "failed"),
    ("compute/observe/tracker_backends.py", "paused"),
    ("compute/recovery.py", "rollback"),
    ("login/flags.py", "signal"),
    ("login/owned_flags.py", "signal"),
}
VOCABULARY = {"common/events.py", "common/event_measures.py"}


def _literals(path: Path) -> Iterator[str]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value


def test_event_names_and_failure_classes_are_written_only_in_the_vocabulary() -> None:
    """Writers build row classes and readers test `isinstance`; classes are FailureClass members:
    no event name or failure class is spelled out anywhere else in the package (besides the
    listed words of other vocabularies). A row is no mapping: mypy refuses row["event"]."""
    kinds = set(events.REGISTRY)
    classes = {c.value for c in FailureClass}
    package = ROOT / "slurmtrain"
    found = set()
    for path in package.rglob("*.py"):
        name = str(path.relative_to(package))
        if name in VOCABULARY:
            continue
        for text in _literals(path):
            if text in classes or (text in kinds and (name, text) not in OTHER_VOCABULARIES):
                found.add((name, text))
    assert not found, sorted(found)


def test_a_row_is_written_as_before(tmp_path: Path) -> None:
    """The class is written under "class", after the placement, as the previous release wrote."""
    run = RunDir(tmp_path)
    where = events.Where(job_id="7", attempt=2, nodes=["n1"], restart=0, relaunch=0)
    row = run.record(events.AttemptEnded(cls=FailureClass.cancelled, exit_code=143), **where)
    raw = row.to_json()
    assert list(raw) == [
        "event",
        "time",
        "job_id",
        "attempt",
        "nodes",
        "restart",
        "relaunch",
        "class",
        "exit_code",
    ]
    (written,) = run.run_events()
    assert written == row and json.loads(json.dumps(raw)) == raw
    assert raw["class"] == "cancelled" and type(raw["class"]) is str
    stop = run.record(events.Stopped(cls=FailureClass.no_nodes, error="no node set"), **where)
    assert (stop.to_json()["class"], stop.error) == ("no_nodes", "no node set")


def test_one_classification_for_supervisor_and_next_attempt() -> None:
    oom = events.Failed(attempt=1, node="n1", error="CUDA out of memory", cls=FailureClass.crash)
    term = events.Signal(attempt=1, signal="SIGTERM")
    assert ledger.classify([oom]) == ledger.Classified(FailureClass.oom, [oom])
    assert ledger.classify([oom], rc=1).cls == FailureClass.oom
    assert ledger.classify([term, oom]).cls == FailureClass.preempted  # vanished: signal first
    assert ledger.classify([term, oom], rc=1).cls == FailureClass.oom  # the rc read already
    assert ledger.classify([], rc=errors.EXIT_REQUEUE).cls == FailureClass.timed_out
    assert ledger.vanished_class([term], 1) == FailureClass.preempted
    assert ledger.vanished_class([], 1) == FailureClass.node_failure
    assert ledger.classify([], rc=1).cls is None


def test_a_class_from_a_newer_version_is_kept_as_written() -> None:
    """A rank's row naming a class this version does not know classifies as that class."""
    newer = events.Failed(attempt=1, error="boom", cls="a_newer_class")
    assert ledger.classify([newer]).cls == "a_newer_class"
    assert ledger.classify([events.Failed(attempt=1, error="boom", cls="")]).cls == "crash"
    hang = events.Failed(attempt=1, error="no progress", cls=FailureClass.hang)
    assert ledger.classify([hang]).cls is None  # a hang alone names no cause of its own
    assert isinstance(
        ledger.classify([events.parse({**newer.to_json(), "class": "oom"})]).cls, FailureClass
    )


def test_what_each_class_implies() -> None:
    assert not events.restarts("config_error") and events.restarts("oom")
    assert events.restarts("a_class_from_a_newer_version")
    assert set(events.RELAUNCH_CLASSES) == {"node_failure", "hang", "crash"}
    assert events.EXIT_CLASS == {
        errors.EXIT_REQUEUE: "timed_out",
        errors.EXIT_BAD_NODE: "node_failure",
        errors.EXIT_HANG: "hang",
        errors.EXIT_CONFIG: "config_error",
    }


# ---- the row classes and the parser --------------------------------------------------------------

PREVIOUS = (
    ROOT / "tests" / "unit" / "data" / "prev_release_run"
)  # written by 44b79dc (crash, resume)


def _file_rows(run: Path) -> list[dict[str, object]]:
    paths = sorted(run.glob("ledger.d/*.jsonl")) + sorted(run.glob("ledger.d/ranks/*/*.jsonl"))
    return [json.loads(x) for p in paths for x in p.read_text().splitlines() if x.strip()]


def _present(row: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in row.items() if v is not None}


def test_a_previous_release_run_directory_reads_the_same() -> None:
    """Every row the previous release wrote parses into its own class (no Unknown), and writes
    back the same keys and values (a null field is not written again; readers see None either
    way): no field lost to a wrong type."""
    raw = _file_rows(PREVIOUS)
    assert len(raw) >= 20
    kinds = set()
    for row in raw:
        parsed = events.parse(row)
        assert not isinstance(parsed, events.Unknown), row
        assert _present(parsed.to_json()) == _present(row), row
        kinds.add(type(parsed))
    assert {events.Started, events.AttemptEnded, events.Failed, events.CheckpointSaved} <= kinds
    merged = RunDir(PREVIOUS).events()
    assert [r.event for r in merged].count("started") == 2
    (ended,) = [r for r in merged if isinstance(r, events.AttemptEnded)]
    assert ended.cls == FailureClass.crash and isinstance(ended.attempt, int)


def test_odd_rows_parse_to_defaults_and_unknown_kinds_survive() -> None:
    odd = events.parse({"event": "started", "attempt": "3", "hosts": "n1", "pids": [1, "x"]})
    assert isinstance(odd, events.Started)
    assert (odd.attempt, odd.hosts, odd.pids, odd.time) == (3, (), (), 0.0)
    newer = events.parse({"event": "from_a_newer_version", "time": 5, "job_id": 12, "x": [1]})
    assert isinstance(newer, events.Unknown) and newer.event == "from_a_newer_version"
    assert (newer.time, newer.job_id, newer.extra) == (5.0, "12", {"x": [1]})
    assert newer.to_json()["x"] == [1] and newer.to_json()["event"] == "from_a_newer_version"
    for junk in ({}, {"event": None}, {"event": "failed", "class": ["no"], "step": True}):
        row = events.parse(junk)
        assert isinstance(row.time, float)
    failed = events.parse({"event": "failed", "class": "crash", "step": 7.0, "error": 3})
    assert isinstance(failed, events.Failed) and (failed.cls, failed.step, failed.error) == (
        "crash",
        7,
        "3",
    )


def test_a_row_object_is_written_with_its_placement(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    row = run.record(events.NodeLost(node="n3"), job_id="9", attempt=1, nodes=["n1", "n3"])
    assert isinstance(row, events.NodeLost) and row.node == "n3" and row.time > 0
    assert row.nodes == ("n1", "n3") and row.job_id == "9"
    (back,) = run.run_events()
    assert back == row
    ranked = run.record_rank(
        events.Failed(cls=FailureClass.hang, error="stuck"),
        job_id="9",
        restart=0,
        relaunch=0,
        on_node="n2",
    )
    (read,) = run.rank_rows("9")
    assert read == ranked and read.node == "n2" and read.cls == "hang"
