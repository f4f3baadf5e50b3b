"""A ledger row as an object: the base class every event kind extends (common/events.py), the one
tolerant parser of rows as files hold them, and the writer's JSON form.

The parser is the only place that knows old or odd rows: a kind this version does not know
becomes `Unknown`, a field of the wrong type takes its default, keys no class declares are kept in
`extra` (a newer writer's fields survive a read). Readers therefore use attributes and
`isinstance` and never test types or keys themselves.

The JSON form is what the ledger always held: `event`, `time`, the placement, then the kind's own
fields (`cls` is written as "class"); fields left None are not written.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from collections.abc import Callable, Mapping
from typing import ClassVar, Optional, Union, get_args, get_origin, get_type_hints

# Attribute names that are Python keywords, and the keys rows hold them under.
JSON_NAMES = {"cls": "class"}
ATTR_NAMES = {v: k for k, v in JSON_NAMES.items()}
# Placement keys every run-tier row has carried since the first release (written even when None).
ALWAYS = ("job_id", "attempt", "nodes")

REGISTRY: dict[str, type[Row]] = {}

# Free text (an error, a traceback) is cut to this many characters as the row is written: a row
# stays a small line every reader can afford (one 64 MiB `error` once stopped `status`); the
# whole text is in the rank's log.
MAX_TEXT = 4096
CUT = "\n[... {} characters cut; the whole text is in the run's logs/ ...]\n"


def capped(text: str, most: int = MAX_TEXT) -> str:
    """`text` within `most` characters: its first quarter and its end (an error's last line, the
    one status shows, is at the end), with a line saying how much was cut and where it all is."""
    if len(text) <= most:
        return text
    head = most // 4
    note = CUT.format(len(text) - most)
    note = CUT.format(len(text) - most + len(note))  # what the note itself takes is cut too
    return text[:head] + note + text[len(text) - (most - head - len(note)) :]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One ledger row: what it is (`kind`, a class attribute), when, and which start (and rank)
    wrote it. `durable`: fsynced before `record` returns, because a later decision reads it.
    `tracked`: marked on the experiment trackers; `closing`: written after the attempt it closes
    (the next attempt's tracker reports it)."""

    kind: ClassVar[str] = ""
    durable: ClassVar[bool] = False
    tracked: ClassVar[bool] = False
    closing: ClassVar[bool] = False

    time: float = 0.0
    job_id: Optional[str] = None
    attempt: Optional[int] = None
    nodes: tuple[str, ...] = ()
    restart: Optional[int] = None
    relaunch: Optional[int] = None
    rank: Optional[int] = None
    node: Optional[str] = None
    extra: Mapping[str, object] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__()
        if cls.kind:
            REGISTRY[cls.kind] = cls

    @property
    def event(self) -> str:
        return type(self).kind

    def to_json(self) -> dict[str, object]:
        """The row as the ledger file holds it."""
        out: dict[str, object] = {"event": self.event, "time": self.time}
        for f in dataclasses.fields(self):
            if f.name in ("time", "extra"):
                continue
            value = getattr(self, f.name)
            if f.name in ALWAYS or not (value is None or value == ()):
                out[JSON_NAMES.get(f.name, f.name)] = _json_value(value)
        out.update(self.extra)
        for key, value in out.items():
            if isinstance(value, str) and len(value) > MAX_TEXT:
                out[key] = capped(value)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unknown(Row):
    """A row of a kind this version does not know (a newer writer's, or a damaged one)."""

    name: str = ""

    @property
    def event(self) -> str:
        return self.name


def _json_value(value: object) -> object:
    """A field as JSON holds it: tuples as lists, a non-finite float as its text ("nan", "inf":
    JSON has no NaN, and a reader in another language must parse every row)."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, enum.Enum):  # FailureClass: its text, as a reader in any language sees it
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    key: str  # the key rows hold it under
    tp: object
    default: object
    factory: Optional[Callable[[], object]]  # a fresh default per row (a dict)
    # the Python types a JSON value of this field is kept as it is (no coercion: the fast path)
    exact: frozenset[type] = frozenset()
    strs: bool = False  # a tuple of strings (nodes, hosts): a list of strings is taken as it is


_FIELDS: dict[type, tuple[_Field, ...]] = {}
_KEYS: dict[type, frozenset[str]] = {}  # the keys a class's fields (and `event`) are read from


def _fields(cls: type[Row]) -> tuple[_Field, ...]:
    """Each field of `cls` with its key, type and default: worked out once per class (a status
    over 501 runs parses thousands of rows)."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = get_type_hints(cls)
        found = _FIELDS[cls] = tuple(
            _field(f, hints[f.name]) for f in dataclasses.fields(cls) if f.name != "extra"
        )
        _KEYS[cls] = frozenset({"event", *(f.key for f in found)})
    return found


def _field(f: dataclasses.Field[object], tp: object) -> _Field:
    key, exact, strs = JSON_NAMES.get(f.name, f.name), _exact(tp), tp == tuple[str, ...]
    if f.default is not dataclasses.MISSING:
        return _Field(f.name, key, tp, f.default, None, exact, strs)
    if f.default_factory is not dataclasses.MISSING:
        return _Field(f.name, key, tp, None, f.default_factory, exact, strs)
    return _Field(f.name, key, tp, _empty(tp), None, exact, strs)  # required: its empty value


_PLAIN = (str, int, float, bool)


def _exact(tp: object) -> frozenset[type]:
    """The types `_coerce` returns unchanged for `tp` (str, int, float, bool, optionally None)."""
    if tp in _PLAIN:
        return frozenset({tp})
    options = [a for a in get_args(tp) if a is not type(None)] if _nullable(tp) else []
    if options and all(o in _PLAIN for o in options):
        return frozenset({type(None), *options})
    return frozenset()


def parse(raw: Mapping[str, object]) -> Row:
    """A row from the file: never raises, whatever it holds."""
    if isinstance(raw, Row):
        return raw
    kind = raw.get("event")
    cls = REGISTRY.get(kind) if isinstance(kind, str) else None
    target: type[Row] = cls or Unknown
    values: dict[str, object] = {}
    fields = _fields(target)
    for f in fields:
        value = raw.get(f.key, _MISSING)
        if type(value) in f.exact:  # as written (most fields of most rows)
            values[f.name] = value
            continue
        if f.strs and type(value) is list and all(type(v) is str for v in value):
            values[f.name] = tuple(value)  # nodes, hosts
            continue
        default = f.factory() if f.factory else f.default
        values[f.name] = default if value is _MISSING else _coerce(f.tp, value, default)
    if cls is None:
        values["name"] = str(kind) if kind is not None else ""
    known = _KEYS[target]
    values["extra"] = {k: v for k, v in raw.items() if k not in known}
    return target(**values)  # type: ignore[arg-type]  # each value coerced to its field's type


def _empty(tp: object) -> object:
    """The value of a required field a row lacks."""
    if _nullable(tp):
        return None
    base = {str: "", int: 0, float: 0.0, bool: False}
    if tp in base:
        return base[tp]
    return () if get_origin(tp) is tuple else None


def _nullable(tp: object) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _coerce(tp: object, value: object, default: object) -> object:
    """`value` as type `tp`, else `default`."""
    if value is None:
        return None if _nullable(tp) else default
    if tp is object:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        for option in options:  # a value already of one of the types is kept as it is
            if _is(option, value):
                return value
        for option in options:
            got = _coerce(option, value, _MISSING)
            if got is not _MISSING:
                return got
        return default
    if origin is tuple:
        (item, *_) = get_args(tp)
        if not isinstance(value, (list, tuple)):
            return default
        items = [_coerce(item, v, _MISSING) for v in value]
        return default if any(i is _MISSING for i in items) else tuple(items)
    if origin is dict or tp is dict:
        return value if isinstance(value, dict) else default
    return _scalar(tp, value, default)


_MISSING = object()


def _is(tp: object, value: object) -> bool:
    if tp in (int, float):
        return isinstance(value, tp) and not isinstance(value, bool)
    return isinstance(tp, type) and isinstance(value, tp)


def _scalar(tp: object, value: object, default: object) -> object:
    if tp is bool:
        return value if isinstance(value, bool) else default
    if tp is str:
        return str(value) if isinstance(value, (str, int, float)) else default
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (int, float) and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except ValueError:
            return default
        if tp is float:
            return number
        return int(number) if math.isfinite(number) and number == int(number) else default
    return default
