"""Branch a run: `resume_from=RUN[:step_N]` starts a new run from another run's checkpoint.

(Going back after a divergence with a lower lr, or past a bad data range.) `resolve` finds the
parent and step, checks the model shape, and rewrites `resume_from` to `PARENT_DIR:step_N` and
`branch_of` (fingerprinted: branches from different steps are different runs); `pin` keeps the
parent's step from its prune (common/checkpoint_pins.py); `record` writes the `branched` row with
the changed keys. No torch: the login node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from slurmtrain.common import checkpoint_format, checkpoint_pins
from slurmtrain.common.derived import node_range, tasks_per_node, world_size
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import Branched, Rows
from slurmtrain.common.fingerprint import ADDED_RESULT_KEYS
from slurmtrain.common.rundir import RunDir, runs_named
from slurmtrain.common.schema import NON_RESULT_KEYS, RootConfig, load_run_config, plain
from slurmtrain.login.composed import typed

# What a checkpoint's tensors are shaped by: a branch must match its parent in each.
ARCHITECTURE_KEYS = (
    "model.num_layers",
    "model.hidden_size",
    "model.num_heads",
    "model.ffn_dim",
    "model.vocab_size",
    "model.max_positions",
    "model.word_embed_proj_dim",
    "model.layer_norm_before",
    "model.family",
    "model.num_kv_heads",
    "model.tie_embeddings",
    "model.hf_extra",
    "deepspeed.stage",  # the ZeRO partitioning the optimizer state was saved in
    "parallel.tensor",  # the AutoTP shards (mp_rank_NN) it was saved in
)
LINEAGE_KEYS = ("resume_from", "branch_of")  # differ by construction; not "changed" keys
_SPEC = re.compile(r"([^:].*?)(?::(?:step_)?(\d+))?")


def _value(cfg: DictConfig | ListConfig, key: str) -> object:
    """`key` of a config; a key added since a parent's was written holds its registered default."""
    return OmegaConf.select(cfg, key, default=ADDED_RESULT_KEYS.get(key))


def parse(spec: str) -> tuple[str, Optional[int]]:
    """`RUN[:step_N]` (or `RUN:N`) -> (RUN, N or None)."""
    match = _SPEC.fullmatch(spec.strip())
    if not match or not match[1]:
        raise ConfigError(
            f"resume_from={spec!r}: not a run; use resume_from=RUN_DIR or RUN_DIR:step_N "
            f"(a run directory, a run name or a fingerprint)"
        )
    return match[1], int(match[2]) if match[2] is not None else None


def find_parent(target: str, runs_root: str) -> RunDir:
    """A run directory by path, by run name (one directory under runs_root) or by fingerprint."""
    found, root = runs_named(target, runs_root)
    if not found and "/" not in target:  # a fingerprint: runs_root/<any name>/<fingerprint>
        found = [RunDir(p.parent.resolve()) for p in sorted(root.glob(f"*/{target}/config.yaml"))]
    if len(found) == 1:
        return found[0]
    if found:
        raise ConfigError(
            f"resume_from={target}: {len(found)} run directories match "
            f"({', '.join(str(r.path) for r in found)}); pass one of them"
        )
    raise ConfigError(
        f"resume_from={target}: no run directory there (no config.yaml) and no run of that name "
        f"or fingerprint under runs_root={root}; pass resume_from=runs/NAME/FINGERPRINT[:step_N]"
    )


def _step_dir(parent: RunDir, step: Optional[int], spec: str) -> Path:
    """The parent's checkpoint to branch from: it must exist and validate (manifest and sizes;
    the ranks checksum it again before loading)."""
    root = parent.checkpoints
    if step is None:
        found = checkpoint_format.find_resumable(root, full=False)
        if found.path is None:
            why = "; ".join(f"{Path(p).name}: {r}" for p, r in found.skipped) or "none saved"
            raise ConfigError(
                f"resume_from={spec}: {parent.path} has no valid checkpoint ({why}); "
                f"branch from a run that saved one"
            )
        return found.path
    directory = root / checkpoint_format.tag(step)
    reason = (
        "no such checkpoint"
        if not directory.is_dir()
        else checkpoint_format.validate(directory, False)
    )
    if reason is not None:
        valid = [
            d.name
            for d in checkpoint_format.step_dirs(root)
            if checkpoint_format.validate(d, False) is None
        ]
        raise ConfigError(
            f"resume_from={spec}: {directory}: {reason}; the parent's valid checkpoints: "
            f"{', '.join(valid) or 'none'}"
        )
    return directory


def _flat(data: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, object] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}"))
    return {k.rstrip("."): v for k, v in out.items()}


def _result_keys(data: Mapping[str, object]) -> dict[str, object]:
    """Dotted key -> value, without the keys that do not change what is computed (every key,
    including one that holds its default: the diff is about values, not fingerprints)."""
    return {
        key: value
        for key, value in _flat(data).items()
        if not any(key == n or key.startswith(f"{n}.") for n in (*NON_RESULT_KEYS, *LINEAGE_KEYS))
    }


def changed_keys(
    parent: Mapping[str, object], child: Mapping[str, object]
) -> dict[str, list[object]]:
    """Result-affecting keys whose value differs: {key: [parent's, branch's]}."""
    theirs, ours = _result_keys(parent), _result_keys(child)
    keys = sorted(set(theirs) | set(ours))
    return {k: [theirs.get(k), ours.get(k)] for k in keys if theirs.get(k) != ours.get(k)}


def resolve(cfg: DictConfig) -> None:
    """Check the branch and write its lineage into the config (before the fingerprint)."""
    if not cfg.resume_from:
        if cfg.data.skip_samples:
            raise ConfigError(
                f"data.skip_samples={cfg.data.skip_samples}: skips data at a branch point only; "
                f"add resume_from=RUN_DIR:step_N, or drop data.skip_samples"
            )
        cfg.branch_of = None
        return
    spec = str(cfg.resume_from)
    if cfg.smoke:  # the smoke run (1 node, <= 2 layers) could not load the parent's checkpoint
        raise ConfigError(
            f"smoke=true: not for a branch (resume_from={spec}): its parent already ran this "
            f"code at this size; submit the branch with smoke=false"
        )
    target, step = parse(spec)
    parent = find_parent(target, str(cfg.runs_root))
    theirs = OmegaConf.load(parent.config)
    differ = [
        f"{key} ({_value(theirs, key)} there, {_value(cfg, key)} here)"
        for key in ARCHITECTURE_KEYS
        if _value(theirs, key) != _value(cfg, key)
    ]
    if differ:
        raise ConfigError(
            f"resume_from={spec}: the parent's checkpoint has another shape: {', '.join(differ)}; "
            f"branch with the parent's model group, deepspeed.stage and parallel.tensor"
        )
    directory = _step_dir(parent, step, spec)
    manifest = checkpoint_format.read_manifest(directory)
    at = int(manifest["step"])
    if cfg.train.max_steps is not None and int(cfg.train.max_steps) <= at:
        raise ConfigError(
            f"train.max_steps={cfg.train.max_steps}: the branch starts at step {at} "
            f"(resume_from={spec}); set train.max_steps above {at}"
        )
    _same_world(typed(cfg), int(manifest.get("world_size", 0)), spec, at)
    cfg.resume_from = f"{parent.path}:{checkpoint_format.tag(at)}"
    cfg.branch_of = f"{parent.path.name}:{checkpoint_format.tag(at)}"


def _same_world(cfg: RootConfig, saved: int, spec: str, at: int) -> None:
    """Another world size would convert the parent's checkpoint to a universal one beside it
    (checkpoint/reshape.py): a write into the parent's directory, which a branch never makes."""
    low, high = node_range(cfg.nodes)
    sizes = {world_size(cfg, n) for n in range(low, high + 1)}
    if saved and saved not in sizes:
        per_node = tasks_per_node(cfg)
        raise ConfigError(
            f"nodes={cfg.nodes}: the parent's {checkpoint_format.tag(at)} (resume_from={spec}) was saved by "
            f"{saved} ranks and this branch runs {'/'.join(map(str, sorted(sizes)))}; branch on "
            f"the parent's world size (nodes x {per_node} tasks = {saved})"
        )


def parent_of(cfg: DictConfig) -> tuple[RunDir, int]:
    """(parent run directory, step) of a resolved branch config."""
    path, _, step = str(cfg.resume_from).rpartition(":")
    return RunDir(Path(path)), int(step.removeprefix("step_"))


def pin(cfg: DictConfig, child: RunDir) -> None:
    """Before the branch is recorded: keep the parent's step from its prune, then make sure it is
    still there (the parent may have pruned it since `resolve` looked)."""
    parent, step = parent_of(cfg)
    checkpoint_pins.pin(parent.checkpoints, step, child.path.name)
    directory = parent.checkpoints / checkpoint_format.tag(step)
    reason = (
        "no such checkpoint"
        if not directory.is_dir()
        else checkpoint_format.validate(directory, False)
    )
    if reason is not None:
        raise ConfigError(f"resume_from={cfg.resume_from}: {directory}: {reason}")


def record(cfg: DictConfig, data: Optional[dict[str, object]], child: RunDir) -> None:
    """The `branched` row, once (the same command again resumes the branch: no second row)."""
    if any(isinstance(e, Branched) for e in child.run_events()):
        return
    parent, step = parent_of(cfg)
    try:  # merged over the schema: a key the parent's version did not have reads as its default
        theirs: object = plain(load_run_config(str(parent.config)))
    except Exception:  # noqa: BLE001  a key this version no longer has: compare as written
        theirs = OmegaConf.to_container(OmegaConf.load(parent.config), resolve=True)
    ours = data if data is not None else plain(cfg)
    assert isinstance(theirs, dict) and isinstance(ours, dict)
    name = theirs.get("name")
    changed = changed_keys(_keyed(theirs.items()), _keyed(ours.items()))
    child.record(
        Branched(
            parent=str(parent.path),
            parent_fingerprint=parent.path.name,
            parent_name=None if name is None else str(name),
            step=step,
            changed=dict[str, object](changed),
        )
    )


def _keyed(items: Iterable[tuple[object, object]]) -> dict[str, object]:
    return {str(k): v for k, v in items}  # a config's keys are strings already


def lineage_line(events: Rows) -> Optional[str]:
    """`branched from PARENT at step_N (changed: k a->b, ...)` for status and the report."""
    row = next((e for e in events if isinstance(e, Branched)), None)
    if row is None:
        return None
    pairs = (row.changed or {}).items()  # record() above: {key: [parent's, branch's]}
    changed = ", ".join(f"{k} {_arrow(v)}" for k, v in pairs)
    return f"branched from {row.parent} at {checkpoint_format.tag(row.step or 0)}" + (
        f" (changed: {changed})" if changed else ""
    )


def _arrow(pair: object) -> str:
    """`a->b` of a changed key's [parent's, branch's] values."""
    a, b = pair if isinstance(pair, (list, tuple)) and len(pair) == 2 else ("?", pair)
    return f"{a}->{b}"
