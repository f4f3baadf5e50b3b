"""Run fingerprints that stay stable across slurmtrain versions.

A run directory is `<runs_root>/<name>/<fingerprint>/`: a short hash of the resolved config minus
the keys that do not change what is computed (schema.NON_RESULT_KEYS). A user who upgrades and
submits the same command again must find the same directory, or an unfinished run starts over
from step 0. So the rule, for anyone adding a config key:

- A key that does not change the weights (where/how often something is saved or logged, placement,
  fault budgets) goes into schema.NON_RESULT_KEYS (or under a section listed there).
- A key that does change them is registered in ADDED_RESULT_KEYS below with the default it ships
  with. The fingerprint leaves a registered key out while it holds that default, so every config
  written before the key existed keeps its hash; any other value is hashed, so it is another run.
- Never change a registered default, move a key between the two classes, rename or remove a
  result key: each changes the fingerprint of runs already on disk.

tests/unit/test_fingerprint_guard.py holds the result keys of the baseline (main at 3a732a1, the
fingerprints users had then) and fails, naming the key and this file, on a result key that is in
neither. tests/unit/test_fingerprint_golden.py pins the fingerprint of every shipped recipe.

`legacy_fingerprints` names the directories a version before a key's registration would have used
(the key hashed at its default), so `rundir.locate` resumes such a run instead of starting over.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import typing
from typing import Iterator, Mapping, Optional

from slurmtrain.common import schema
from slurmtrain.common.schema import RootConfig

View = dict[str, object]  # the config as plain dicts (schema.plain), as hashed

# Result keys added after the baseline, oldest first, each with the default it was introduced with
# (a dotted path; a whole new section may be one entry with its default dict). Append only.
ADDED_RESULT_KEYS: dict[str, object] = {
    "data.skip_samples": 0,  # a branch's skipped data range (login/branch.py)
    "branch_of": None,  # a branch's parent fingerprint and step: its lineage
    "model.family": "opt",  # the transformers model_type
    "model.num_kv_heads": None,  # GQA/MQA key-value heads; None: as many as query heads
    "model.tie_embeddings": True,
    "model.hf_extra": {},  # config.json keys passed through to the family's config class
    "optim.decay": "linear",  # the lr decay's shape after warm-up (recipe=llama: cosine)
    "model.attn_implementation": "auto",  # auto: SDPA where the class supports it, else eager
    "parallel.tensor": 1,  # DeepSpeed AutoTP's degree (equal within ~1e-6, not bitwise)
    "parallel.sequence": 1,  # DeepSpeed Ulysses' degree (equal within ~1e-6, not bitwise)
    "data.text_checksum": None,  # data=text: the corpus's content + tokenizer (text_corpus.py)
}


def canonical(value: object) -> str:
    """The JSON text the fingerprint hashes (1 and 1.0 differ, as they do in the hash)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def digest(view: Mapping[str, object]) -> str:
    return hashlib.sha256(canonical(view).encode()).hexdigest()[:12]


def drop(data: View, key: str) -> None:
    """Remove dotted `key` from nested dicts (absent: nothing to do)."""
    parent, _, leaf = key.rpartition(".")
    node: object = data
    for part in parent.split(".") if parent else []:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def drop_defaults(view: View, keys: Optional[list[str]] = None) -> View:
    """`view` (changed in place) without the registered `keys` (default: all) that hold their
    registered default; a section left empty by that is dropped too (it did not exist before)."""
    for key in ADDED_RESULT_KEYS if keys is None else keys:
        path = key.split(".")
        chain: list[View] = [view]
        for part in path[:-1]:
            nxt = chain[-1].get(part)
            if not isinstance(nxt, dict):
                break
            chain.append(nxt)
        else:
            leaf, default = path[-1], canonical(ADDED_RESULT_KEYS[key])
            if leaf in chain[-1] and canonical(chain[-1][leaf]) == default:
                chain[-1].pop(leaf)
                for parent, part in zip(reversed(chain[:-1]), reversed(path[:-1])):
                    if parent[part]:
                        break
                    parent.pop(part)
    return view


def legacy_fingerprints(view: View) -> Iterator[str]:
    """The fingerprints versions before each registration gave this config, newest first: a
    version where registered keys [:j] existed but were not yet registered hashed them as they
    were, or registered one key late. `view`: the result view before drop_defaults (not
    changed)."""
    names = list(ADDED_RESULT_KEYS)
    seen: set[str] = set()
    for j in range(len(names), 0, -1):
        # keys [:j] hashed (none registered yet), or key j-1 alone (registered late)
        for hashed in (names[:j], names[j - 1 : j]):
            old = drop_defaults(copy.deepcopy(view), [n for n in names if n not in hashed])
            name = digest(old)
            if name not in seen:
                seen.add(name)
                yield name


def _is_section(kind: object) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def schema_keys(root: type = RootConfig, prefix: str = "") -> list[str]:
    """Every leaf key of the typed schema (RootConfig), dotted; dicts and lists are leaves."""
    out = []
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        kind = hints[f.name]
        if _is_section(kind):
            out += schema_keys(kind, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


def is_result_key(key: str, non_result: Optional[tuple[str, ...]] = None) -> bool:
    """Whether `key` is hashed: neither it nor a section above it is a non-result key (read at
    call time: tests reclassify keys)."""
    if non_result is None:
        non_result = schema.NON_RESULT_KEYS
    parts = key.split(".")
    return not any(".".join(parts[:i]) in non_result for i in range(1, len(parts) + 1))


def result_keys(root: type = RootConfig) -> list[str]:
    return [k for k in schema_keys(root) if is_result_key(k)]


def schema_default(key: str, root: type = RootConfig) -> object:
    """The schema's default of dotted `key` (dataclasses.MISSING when it has none)."""
    kind = root
    parts = key.split(".")
    for part in parts[:-1]:
        kind = typing.get_type_hints(kind)[part]
    f = {f.name: f for f in dataclasses.fields(kind)}[parts[-1]]
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


REGISTER_HINT = (
    "register it in slurmtrain/common/fingerprint.py ADDED_RESULT_KEYS (append "
    "'{key}': <the default it ships with>) if it changes what is computed (the weights), else "
    "add it to NON_RESULT_KEYS in slurmtrain/common/schema.py; never add it to the baseline file"
)


def registry_problems(baseline: list[str], root: type = RootConfig) -> list[str]:
    """One line per way the schema breaks the rule above against `baseline`, the result keys of
    the fingerprint baseline: a new result key neither registered nor non-result, a baseline key
    gone or reclassified, a registered key that is not a result key or ships another default."""
    keys, results = set(schema_keys(root)), set(result_keys(root))
    out = [
        f"config key {key} is new and changes the fingerprint of every run: "
        + REGISTER_HINT.format(key=key)
        for key in sorted(results - set(baseline))
        if not _registered(key)
    ]
    for key in sorted(set(baseline) - results):
        where = "is now a non-result key" if key in keys else "is gone from the schema"
        out.append(
            f"config key {key} {where}: every run's fingerprint changes (users' unfinished runs "
            f"restart from step 0); keep it a result key with its default"
        )
    for key, default in ADDED_RESULT_KEYS.items():
        if key in baseline or not is_result_key(key) or not _in_schema(key, keys):
            out.append(
                f"ADDED_RESULT_KEYS[{key!r}]: not a result key added since the baseline; "
                f"remove the entry"
            )
        elif canonical(schema_default(key, root)) != canonical(default):
            out.append(
                f"ADDED_RESULT_KEYS[{key!r}] = {default!r} but the schema's default is "
                f"{schema_default(key, root)!r}: register the default the key shipped with and "
                f"never change it (a new default is a new key)"
            )
    return out


def _registered(key: str) -> bool:
    """`key`, or a section above it, is in ADDED_RESULT_KEYS."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in ADDED_RESULT_KEYS for i in range(1, len(parts) + 1))


def _in_schema(key: str, keys: set[str]) -> bool:
    """A leaf key, or a section (its leaves registered together as one dict)."""
    return key in keys or any(k.startswith(key + ".") for k in keys)
