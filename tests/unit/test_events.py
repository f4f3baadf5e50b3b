"""The ledger vocabulary (common/events.py): one failure-class table, rows unchanged on disk."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator, Optional

from slurmtrain.cli import report
from slurmtrain.common import errors, event_fields, events, jsonl, ledger, schema
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir
from slurmtrain.compute import startup
from slurmtrain.compute.checkpoint import select
from slurmtrain.planning import deadlines

ROOT = Path(__file__).resolve().parents[2]


class _Axes:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []

    def axvline(self, x: float, **style: object) -> None:
        self.lines.append(style)


def test_every_failure_class_has_its_own_report_colour() -> None:
    """A `failed` row of any class is drawn in a colour of its own, never the unknown grey."""
    rows = [
        {"event": "failed", "time": 1.0 + i, "class": c.value} for i, c in enumerate(FailureClass)
    ]
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
    assert jsonl.FATE_EVENTS == event_fields.DURABLE_KINDS
    assert "attempt_ended" in event_fields.DURABLE_KINDS
    assert "startup" not in event_fields.DURABLE_KINDS


def test_writers_name_every_event_from_the_vocabulary() -> None:
    """No writer passes an event name as a string literal to record(...): each names a `Kind` (or
    uses a constructor), so a misspelt event fails the type check instead of writing a stray row."""
    literal = re.compile(r"\b(?:record|record_rank|record_any)\(\s*[\"']([a-z_]+)[\"']")
    named = re.compile(r"\bKind\.([a-z_]+)")
    found: dict[str, list[str]] = {}
    used: set[str] = set()
    for path in (ROOT / "slurmtrain").rglob("*.py"):
        text = path.read_text()
        if literal.findall(text):
            found[str(path.relative_to(ROOT))] = literal.findall(text)
        used |= set(named.findall(text))
    assert not found, found
    assert used and used <= {k.name for k in events.Kind}, used - {k.name for k in events.Kind}


def test_a_constructed_row_is_written_as_before(tmp_path: Path) -> None:
    """The class is written under "class", after the caller's fields, as the string literal was."""
    run = RunDir(tmp_path)
    where = events.Where(job_id="7", attempt=2, nodes=["n1"], restart=0, relaunch=0)
    row = run.record(events.attempt_ended(ledger.CANCELLED, exit_code=143), **where)
    assert list(row) == [
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
    assert written == json.loads(json.dumps(row))
    assert written["class"] == "cancelled" and type(written["class"]) is str
    stop = run.record(events.stopped(FailureClass.no_nodes, "no node set"), **where)
    assert stop["class"] == "no_nodes" and stop["error"] == "no node set"


def test_one_classification_for_supervisor_and_next_attempt() -> None:
    oom = {
        "event": "failed",
        "attempt": 1,
        "node": "n1",
        "error": "CUDA out of memory",
        "class": "crash",
    }
    term = {"event": "signal", "attempt": 1, "signal": "SIGTERM"}
    assert ledger.classify([oom]).cls == "oom"
    assert ledger.classify([oom], rc=1).cls == "oom"
    assert ledger.classify([term, oom]).cls == "preempted"  # vanished: the signal first
    assert ledger.classify([term, oom], rc=1).cls == "oom"  # the supervisor read the rc already
    assert ledger.vanished_class([term], 1) == "preempted"
    assert ledger.vanished_class([], 1) == "node_failure"
    assert ledger.classify([], rc=1).cls is None


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


# ---- each kind's fields (common/event_fields.py) against every writer and constructor -----------

WRITERS = ("record", "record_rank", "record_any")  # RunDir's, and Attempt's (compute/context.py)
SOURCES = ("slurmtrain", "bench", "tools")
# Every constructor, each optional key filled: the fields it fixes on its kind's rows.
BUILT = {
    "attempt_ended": events.attempt_ended("crash"),
    "stopped": events.stopped("crash", "why"),
    "failed": events.failed("crash", "why"),
    "relaunch_abandoned": events.relaunch_abandoned("crash", "why"),
    "requeued": events.requeued(
        "crash", "2", "resubmit", excluded=[], exclusions_dropped=[], at="x"
    ),
}
# `**splats` whose keys no TypedDict, dict literal or annotation in the source gives: the code
# that builds them, run.
SPLATS: dict[str, Callable[[], set[str]]] = {
    "self.row()": lambda: set(startup.StartupClock(0.0).row()) | _keywords(("mark", "_mark")),
    "limits.summary()": lambda: set(deadlines.from_config(schema.FaultsConfig()).summary()),
    "choice.applied": lambda: set(select.ResumeApplied.__annotations__),
}
Scopes = list["_Scope"]


@functools.cache
def _trees() -> tuple[tuple[str, ast.Module], ...]:
    return tuple(
        (str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path)))
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
    )


def _nodes() -> Iterator[tuple[str, ast.AST]]:
    return ((path, node) for path, tree in _trees() for node in ast.walk(tree))


def _keywords(callees: tuple[str, ...]) -> set[str]:
    """The keywords every call of `callees` passes (StartupClock.mark's facts go into `startup`)."""
    return {
        k.arg
        for _, n in _nodes()
        if isinstance(n, ast.Call) and _name(n.func) in callees
        for k in n.keywords
        if k.arg
    }


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """`node` and what it holds, nested functions left out (each is a scope of its own)."""
    yield node
    for c in ast.iter_child_nodes(node):
        if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _own_nodes(c)


class _Scope:
    """A function's (or module's) own names: each one's annotations and values, its
    `name["key"] = ...` stores, and which are parameters (a writer passing its caller's on)."""

    def __init__(self, node: ast.AST) -> None:
        self.sources: dict[str, list[tuple[str, ast.expr]]] = {}
        self.stores: dict[str, set[str]] = {}
        self.params: set[str] = set()
        args = getattr(node, "args", None)
        if isinstance(args, ast.arguments):
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            for a in filter(None, every):
                self.params.add(a.arg)
                self._add(a.arg, "annotation", a.annotation)
        body = getattr(node, "body", [])
        for stmt in body if isinstance(body, list) else [body]:
            for n in _own_nodes(stmt):
                for t in n.targets if isinstance(n, ast.Assign) else []:
                    if isinstance(t, ast.Name):
                        self._add(t.id, "value", n.value)
                    elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                        if isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                            self.stores.setdefault(t.value.id, set()).add(t.slice.value)
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    self._add(n.target.id, "annotation", n.annotation)
                    self._add(n.target.id, "value", n.value)

    def _add(self, name: str, how: str, node: Optional[ast.expr]) -> None:
        if node is not None:
            self.sources.setdefault(name, []).append((how, node))


class _Keys:
    """The keys a `**splat` puts in a row, read from the source; None when it cannot tell."""

    def __init__(self) -> None:
        classes = [n for _, n in _nodes() if isinstance(n, ast.ClassDef)]
        self.typed: dict[str, set[str]] = {"TypedDict": set()}
        for _ in range(3):  # a TypedDict whose base comes later in the walk
            for c in classes:
                bases = [_name(b) for b in c.bases]
                if bases and all(b in self.typed for b in bases):
                    own = {s.target.id for s in c.body if isinstance(s, ast.AnnAssign)}
                    self.typed[c.name] = own.union(*(self.typed[b] for b in bases))
        defs = [n for _, n in _nodes() if isinstance(n, ast.FunctionDef)]
        once = Counter(d.name for d in defs)  # a name defined twice could be either
        self.returns = {d.name: d.returns for d in defs if once[d.name] == 1 and d.returns}

    def of(self, node: ast.expr, scopes: Scopes) -> Optional[set[str]]:
        if isinstance(node, ast.Dict):
            keys: set[str] = set()
            for key, value in zip(node.keys, node.values):
                inner = {key.value} if isinstance(key, ast.Constant) else None
                inner = self.of(value, scopes) if key is None else inner
                if inner is None:
                    return None
                keys |= inner
            return keys
        if isinstance(node, ast.IfExp):
            body, orelse = self.of(node.body, scopes), self.of(node.orelse, scopes)
            return None if body is None or orelse is None else body | orelse
        if isinstance(node, ast.Call) and _name(node.func) in self.typed:
            return self.typed[_name(node.func)]
        if isinstance(node, ast.Call) and _name(node.func) in self.returns:
            return self.annotation(self.returns[_name(node.func)])
        if isinstance(node, ast.Name):
            return self.name(node.id, scopes)
        built = SPLATS.get(ast.unparse(node))
        return built() if built else None

    def annotation(self, node: ast.expr) -> Optional[set[str]]:
        """The keys of an annotation naming a TypedDict (`Unpack[T]`, `Optional[T]`, `T`)."""
        if isinstance(node, ast.Subscript) and _name(node.value) in ("Unpack", "Optional"):
            return self.annotation(node.slice)
        return self.typed.get(_name(node))

    def name(self, name: str, scopes: Scopes) -> Optional[set[str]]:
        for scope in reversed(scopes):
            if name in scope.sources or name in scope.stores:
                found = [
                    self.annotation(n) if how == "annotation" else self.of(n, scopes)
                    for how, n in scope.sources.get(name, [])
                ]
                known = [k for k in found if k is not None]
                if not known and name not in scope.stores:
                    return None
                return set(scope.stores.get(name, ())).union(*known)
        return None


def _kinds(first: ast.expr, scopes: Scopes) -> Optional[list[tuple[str, Optional[ast.Call]]]]:
    """Which kinds a writer's first argument records, each with its constructor call if any: []
    when it passes its caller's event on or is not an event (login/prepare.py's `record` takes a
    prepared run); None when a name is assigned something the source cannot tell."""
    if isinstance(first, ast.Attribute) and _name(first.value) == "Kind":
        return [(first.attr, None)]
    if isinstance(first, ast.Call) and _name(first.func) in BUILT:
        return [(BUILT[_name(first.func)].kind.value, first)]
    if not isinstance(first, ast.Name):
        return []  # another `record` (login/branch.py's); a CUDA event's takes no argument
    for scope in reversed(scopes):
        if first.id in scope.params:
            return []
        values = [n for how, n in scope.sources.get(first.id, []) if how == "value"]
        if values:
            found = [_kinds(v, scopes) for v in values]
            return None if None in found else [k for each in found for k in each or []]
    return []  # a loop's or an import's name: no event is built that way


def _writer_calls(node: ast.AST, scopes: Scopes) -> Iterator[tuple[ast.Call, Scopes]]:
    """Every writer call under `node`, with the scopes it sees (innermost last)."""
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        scopes = [*scopes, _Scope(node)]
    if isinstance(node, ast.Call) and _name(node.func) in WRITERS and node.args:
        yield node, scopes
    for child in ast.iter_child_nodes(node):
        yield from _writer_calls(child, scopes)


def _written() -> tuple[dict[str, set[str]], list[str]]:
    """Each kind's keys as its writers pass them (constructors' fixed ones included), and the
    problems: a key its kind does not declare, a kind or `**splat` the source cannot tell."""
    own = {
        name  # durable, on_node: record/record_rank's own, never a row key
        for method in (RunDir.record, RunDir.record_rank)
        for name, p in inspect.signature(method).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    } - event_fields.PLACEMENT
    keys, written, problems = _Keys(), {k.value: set() for k in events.Kind}, []
    for path, tree in _trees():
        for call, scopes in _writer_calls(tree, []):
            at = f"{path}:{call.lineno}"
            kinds = _kinds(call.args[0], scopes)
            if kinds is None:
                problems.append(f"{at}: which kind {ast.unparse(call.args[0])} records")
            for kind, built in kinds or []:
                given = [*call.keywords, *(built.keywords if built else [])]
                fixed = set(BUILT[_name(built.func)].fields) if built else set()
                for k in given:
                    found = {k.arg} if k.arg else keys.of(k.value, scopes)
                    if found is None:
                        problems.append(f"{at}: the keys of **{ast.unparse(k.value)}")
                        continue
                    declared = event_fields.SPECS[events.Kind(kind)].fields
                    problems += [
                        f"{at}: {kind} gets {key!r}, undeclared (common/event_fields.py)"
                        for key in sorted(found - set(declared) - event_fields.PLACEMENT - own)
                    ]
                    written[kind] |= found - own
                written[kind] |= fixed
    return written, problems


def test_the_table_declares_every_kind_once() -> None:
    tree = ast.parse((ROOT / "slurmtrain" / "common" / "event_fields.py").read_text())
    (table,) = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.AnnAssign) and _name(n.target) == "SPECS"
    ]
    assert isinstance(table, ast.Dict)
    named = [ast.unparse(k) for k in table.keys if k is not None]
    assert sorted(named) == sorted(f"Kind.{k.name}" for k in events.Kind)  # each exactly once
    for kind, spec in event_fields.SPECS.items():
        assert spec.when and len(set(spec.fields)) == len(spec.fields), kind
    durable = {k for k, spec in event_fields.SPECS.items() if spec.durable}
    assert event_fields.DURABLE_KINDS == durable


def test_every_constructor_fixes_declared_fields_only() -> None:
    made = {
        name
        for name, f in vars(events).items()
        if inspect.isfunction(f)
        and inspect.signature(f).return_annotation in ("Event", events.Event)
    }
    assert made == set(BUILT)  # a new constructor: add it to BUILT, its optional keys filled
    for name, event in BUILT.items():
        declared = event_fields.SPECS[event.kind].fields
        assert set(event.fields) <= set(declared), (name, set(event.fields) - set(declared))


def test_every_writer_passes_its_kinds_declared_fields() -> None:
    """Every record/record_rank/record_any call in the sources, its `**splats` followed to the
    TypedDict, dict or function that builds them: each key is declared for its kind (or a
    placement key); each declared field has a writer; a kind no writer records declares none."""
    written, problems = _written()
    assert not problems, "\n".join(problems)
    for kind, spec in event_fields.SPECS.items():
        assert set(spec.fields) <= written[kind], (kind, set(spec.fields) - written[kind])


def test_rows_built_by_hand_hold_declared_fields() -> None:
    """Rows the sources build as dict literals (a bench's synthetic ledger, a reader's stand-in)
    hold their kind's fields too."""
    problems = []
    for path, node in _nodes():
        if not isinstance(node, ast.Dict):
            continue
        named = {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
        kind = named.get("event")
        if not (isinstance(kind, ast.Constant) and kind.value in set(events.Kind)):
            continue
        declared = set(event_fields.SPECS[events.Kind(kind.value)].fields) | event_fields.PLACEMENT
        problems += [f"{path}:{node.lineno}: {kind.value} {k!r}" for k in set(named) - declared]
    assert not problems, "\n".join(problems)
