"""The run directory: the single source of truth both worlds read and write.

`<runs_root>/<name>/<fingerprint>/` holds the resolved config, the user's overrides, the batch script,
provenance per attempt, the ledger (`ledger.d/`, one event a line: a run tier of one file per
writing process and a rank tier of one file per node per attempt for the rows any rank writes;
merged in time order by `RunDir.events()`, or read a tier and an attempt at a time; see
common/jsonl.py), metrics and checkpoints. The fingerprint
hashes the resolved config minus keys that do not change the result, so submitting the same experiment
twice finds the first one instead of silently training it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

from slurmtrain.common import checkpoint_dir, ownership, runlock
from slurmtrain.common.durable import replace_atomically
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.events import Finished, Row, Rows, Started
from slurmtrain.common.jsonl import (  # noqa: F401  append_jsonl, read_jsonl: metrics, bad nodes
    FATE_EVENTS,
    LEDGER_DIR,
    LEGACY_LEDGER,
    append_jsonl,
    append_own,
    append_rank_row,
    ledger_rows,
    merge_jsonl,
    merge_ledger,
    merge_rows,
    rank_key,
    rank_tier_files,
    read_jsonl,
    run_tier_files,
)
from slurmtrain.common.liveness import (  # noqa: F401  where callers have always found them
    ACTIVE_SLURM_STATES,
    StateUnknown,
    job_alive,
    pid_start,
    slurm_job_alive,
)

if TYPE_CHECKING:  # start-up speed: readers (status, logs) never load OmegaConf, YAML, the schema
    from omegaconf import DictConfig

FINISHED, RUNNING, STOPPED, NEW = "finished", "running", "stopped", "new"


def result_view(
    cfg: DictConfig, data: Optional[dict[str, object]] = None, registered: bool = True
) -> dict[str, object]:
    """The config as a plain dict without the keys that do not change what is computed, nor the
    result keys added since the baseline that hold their registered default (common/fingerprint.py
    says why; `registered=False` keeps them). `data`: schema.plain(cfg) when the caller has it
    (left as it is: only the dicts the drops change are copied, not all of it per sweep point)."""
    from slurmtrain.common.fingerprint import ADDED_RESULT_KEYS, drop, drop_defaults
    from slurmtrain.common.nested_copy import copied_along
    from slurmtrain.common.schema import NON_RESULT_KEYS, plain

    changed = [*NON_RESULT_KEYS, *ADDED_RESULT_KEYS]
    view = plain(cfg) if data is None else copied_along(data, changed)
    for key in NON_RESULT_KEYS:
        drop(view, key)
    return drop_defaults(view) if registered else view


def fingerprint(cfg: DictConfig, data: Optional[dict[str, object]] = None) -> str:
    """The run's directory name: stable across versions (common/fingerprint.py has the rule)."""
    from slurmtrain.common.fingerprint import digest

    return digest(result_view(cfg, data))


@dataclass(frozen=True)
class RunDir:
    path: Path
    # run_dir_mode's bits where the config is known (locate); None: the directory exists already
    # and is only checked (common/ownership.py)
    mode: Optional[int] = field(default=None, compare=False)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def ledger(self) -> Path:
        """The single-file ledger of run directories made before `ledger.d/` (still read, never
        written). Read the ledger with `events()`, never this file alone."""
        return self.path / LEGACY_LEDGER

    @property
    def ledger_dir(self) -> Path:
        """The ledger: one JSON-lines file per writing process (common/jsonl.py says why)."""
        return self.path / LEDGER_DIR

    def ledger_files(self) -> list[Path]:
        """The run tier's files: the old single file first (if any), then the writers' files."""
        return run_tier_files(self.path)

    def rank_files(self, job_id: object = None, restart: int = 0, relaunch: int = 0) -> list[Path]:
        """The rank tier's node files of one attempt key, or of every attempt (job_id None)."""
        key = None if job_id is None else rank_key(job_id, restart, relaunch)
        return rank_tier_files(self.path, key)

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def latest(self) -> Path:
        """The checkpoint pointer: the newest published step's tag (common/checkpoint_format.py writes it)."""
        return self.checkpoints / "latest"

    def injected(self, fault: str) -> Path:
        """Marks a fault injection that fires once per run (created O_EXCL by the first rank)."""
        return self.path / f"inject.{fault}.done"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def provenance(self) -> Path:
        return self.path / "provenance"

    @property
    def sbatch(self) -> Path:
        return self.path / "job.sbatch"

    @property
    def bad_nodes(self) -> Path:
        """Nodes the health gate (or straggler detection) flagged, one JSON row each. One writer
        at a time: rank 0 while the step runs, then the batch shell's supervisor after it."""
        return self.path / "bad_nodes.jsonl"

    @property
    def lock(self) -> Path:
        """flock(2)ed (or a lease beside it: common/runlock.py) around check-and-submit (login),
        resubmission (supervisor) and the compute side's owner check, so two of them never both
        decide the run is free."""
        return self.path / ".owner.lock"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def profile(self) -> Path:
        return self.path / "profile"

    def hang_dump(self, attempt: int, node: str) -> Path:
        """Where the watchdog writes the stacks of a node's hung ranks (one block per rank)."""
        return self.path / "hangs" / f"attempt{attempt}.{node}.txt"

    def rank_log(self, job_id: str, rank: int, stream: str = "out") -> Path:
        """A rank's output, as srun writes it (`--output=logs/%j_%t.out`) and local tasks too."""
        return self.logs / f"{job_id}_{rank}.{stream}"

    def events(self) -> Rows:
        """The whole ledger, both tiers, in time order (a corrupt line is reported on stderr,
        once, naming its file and line; a torn last line of a live file is skipped). Every rank's
        rows of every attempt: at scale read `run_events` and one attempt's `rank_rows`."""
        return ledger_rows(self.path)

    def run_events(self) -> Rows:
        """The run tier only (login, supervisor, cancel, rank 0): O(attempts) files."""
        return merge_ledger(self.ledger_files())

    def rank_rows(self, job_id: object, restart: int = 0, relaunch: int = 0) -> Rows:
        """The rows every rank wrote in one attempt key (failures, hangs): O(nodes) files."""
        return merge_ledger(self.rank_files(job_id, restart, relaunch), shared=True)

    def attempt_events(
        self, job_id: object, restart: int = 0, relaunch: int = 0, run_rows: Optional[Rows] = None
    ) -> Rows:
        """The run tier (`run_rows` if the caller has it) and one attempt key's rank rows, in
        time order: what classifying that attempt needs."""
        rows = self.run_events() if run_rows is None else run_rows
        return merge_rows([rows, self.rank_rows(job_id, restart, relaunch)])

    def record(
        self,
        event: Row,
        *,
        job_id: Optional[str] = None,
        attempt: Optional[int] = None,
        nodes: Iterable[str] = (),
        durable: Optional[bool] = None,
        **fields: object,
    ) -> Row:
        """Append one run-tier row: a row object, its placement filled from the keywords where it
        has none (`fields`: more placement, events.Where's keys)."""
        where = dict(job_id=job_id, attempt=attempt, nodes=tuple(nodes))
        row = _placed(event, {**where, **fields})
        # This process's own file (no other process ever writes it); fate-deciding events fsynced
        # (durable=False: the caller syncs many at once, as a sweep does its `submitted` events).
        durable = type(row).durable if durable is None else durable
        append_own(self.ledger_dir, row.to_json(), durable=durable)
        return row

    def record_rank(
        self,
        event: Row,
        *,
        job_id: Optional[str],
        restart: int,
        relaunch: int,
        on_node: str,
        **fields: object,
    ) -> Row:
        """A row any rank writes (a failure, a hang) into the rank tier: the file of its node
        `on_node` (also the row's `node` unless `fields` name another, or None)."""
        where = dict(job_id=job_id, attempt=None, node=on_node, restart=restart, relaunch=relaunch)
        row = _placed(event, {**where, **fields})
        key = rank_key(job_id, restart, relaunch)
        append_rank_row(self.path, key, str(on_node or "_"), row.to_json())
        return row

    @contextlib.contextmanager
    def locked(self, timeout: float = 60.0) -> Iterator[None]:
        """Hold the run's exclusive lock (`lock`): check-and-submit, resubmit, claim a start.
        Raises RunLocked after `timeout` s (a local run's shell holds it while it trains).
        flock, or a lease file where the filesystem's flock excludes nothing (common/runlock.py).
        The directory is made with `mode`, or refused when another user made or can swap it."""
        ownership.make_run_dir(self.path, self.mode)

        def busy(who: str) -> RunLocked:
            return RunLocked(f"{who} (submitting or training this run locally); nothing submitted")

        with runlock.hold(self.path, timeout, busy, self.lock.name, self.mode):
            yield

    def attempts(self) -> int:
        return sum(isinstance(r, Started) for r in self.run_events())

    def state(self, rows: Optional[Rows] = None) -> str:
        """finished | running | stopped | new, from the ledger's run tier (`rows` when the caller
        has read it) and the owner job's liveness. Raises StateUnknown (fail closed) when Slurm
        cannot say whether the owner job lives."""
        rows = self.run_events() if rows is None else rows
        if not rows:
            return NEW
        if any(isinstance(r, Finished) for r in rows):
            return FINISHED
        if job_alive(rows):
            return RUNNING
        return STOPPED


def _placed(row: Row, fields: dict[str, object]) -> Row:
    """The row to write, stamped now: its own placement values kept, the caller's filling the rest."""
    own = {k: v for k, v in fields.items() if getattr(row, k) in (None, ())}
    return dataclasses.replace(row, time=time.time(), **own)  # type: ignore[arg-type]


class RunLocked(ConfigError):
    """Another process holds the run's lock for longer than we wait."""


def locate(cfg: DictConfig, data: Optional[dict[str, object]] = None) -> RunDir:
    """The run directory this config trains in; `new_run=true` picks the next free replica."""
    root = Path(cfg.runs_root).expanduser().resolve() / cfg.name
    base = root / fingerprint(cfg, data)
    mode = ownership.dir_mode(getattr(cfg, "run_dir_mode", None))
    if not cfg.new_run:
        found = RunDir(base) if base.exists() else _made_before_registration(cfg, data, base)
        return RunDir(found.path, mode)
    replica = 2
    while (root / f"{base.name}-r{replica}").exists():
        replica += 1
    return RunDir(root / f"{base.name}-r{replica}", mode)


def _made_before_registration(
    cfg: DictConfig, data: Optional[dict[str, object]], base: Path
) -> RunDir:
    """This config's run from a version that hashed a since-registered key at its default (one
    existence check per registered key); else `base`, a new run."""
    from slurmtrain.common.fingerprint import ADDED_RESULT_KEYS, legacy_fingerprints
    from slurmtrain.common.legacy_runs import older_runs_beside

    if ADDED_RESULT_KEYS and older_runs_beside(base):  # only its own runs beside: none older
        for name in legacy_fingerprints(result_view(cfg, data, registered=False)):
            if (base.parent / name / "config.yaml").is_file():
                return RunDir(base.parent / name)
    return RunDir(base)


def config_yaml(cfg: DictConfig, data: Optional[dict[str, object]] = None) -> str:
    """OmegaConf.to_yaml's text, written by libyaml's C emitter (~10x faster: a 64-point sweep
    writes 64 configs); strings that would read back as numbers or booleans stay quoted. Each
    top-level section is written once per distinct value: a sweep's points share most of them."""
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
    from omegaconf import OmegaConf

    from slurmtrain.common.schema import plain

    dumper = _yaml_dumper()
    if dumper is None:
        return OmegaConf.to_yaml(cfg, resolve=True)
    if data is None:
        data = plain(cfg)
    style = dict(Dumper=dumper, default_flow_style=False, allow_unicode=True, sort_keys=False)
    if not data:
        empty: str = yaml.dump(data, **style)
        return empty
    out = []
    for key, value in data.items():
        memo = repr((key, value))  # exact: the plain container of str/int/float/bool/None/enums
        text = _SECTIONS.get(memo)
        if text is None:
            text = yaml.dump({key: value}, **style)
            if len(_SECTIONS) >= 4096:
                _SECTIONS.clear()
            _SECTIONS[memo] = text
        out.append(text)
    return "".join(out)


_SECTIONS: dict[str, str] = {}  # config_yaml's texts of top-level sections, by value


@functools.lru_cache(maxsize=1)
def _yaml_dumper() -> Optional[type]:
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    base = getattr(yaml, "CDumper", None)
    if base is None:
        return None

    class Dumper(base):  # type: ignore[misc, valid-type]
        pass

    Dumper.add_representer(str, get_omega_conf_dumper().str_representer)
    return Dumper


def create(
    run: RunDir,
    cfg: DictConfig,
    overrides: list[str],
    durable: bool = True,
    data: Optional[dict[str, object]] = None,
) -> None:
    """Write the config files (first submission) and the directory skeleton (durable=False: the
    caller syncs many at once, as a sweep does; `data`: as for config_yaml)."""
    import yaml

    mode = ownership.dir_mode(getattr(cfg, "run_dir_mode", None))
    ownership.make_run_dir(run.path, mode)  # refused when another user made or can swap it
    saves = cfg.checkpoint.dir if "checkpoint" in cfg else None
    for sub in (run.checkpoints, run.logs, run.provenance):
        if sub == run.checkpoints and saves:
            checkpoint_dir.link(run.path, str(saves), mode)  # a link to checkpoint.dir's
            continue
        ownership.make_dir(sub, mode)
    data = _model_config_copied(run, cfg, data, durable)
    text = config_yaml(cfg, data)
    if run.config.exists() and run.config.read_text() != text:
        # Same fingerprint, different non-result keys (nodes, cluster, name...): keep the history.
        stamp = time.strftime("%Y%m%d-%H%M%S")
        os.replace(run.config, run.path / f"config.{stamp}.yaml")
    # 0640 at most: a run's records are not world-readable
    replace_atomically(run.config, text, mode=0o640, durable=durable)
    replace_atomically(
        run.path / "overrides.yaml", yaml.safe_dump(list(overrides)), mode=0o640, durable=False
    )


def _model_config_copied(
    run: RunDir, cfg: DictConfig, data: Optional[dict[str, object]], durable: bool
) -> Optional[dict[str, object]]:
    """model=hf: the model's config.json copied into the run directory (hf_config.RUN_COPY, what
    the compute side builds from: it never reads the user's folder) and `data` (what config.yaml
    records) naming that copy, relative to the run directory (schema.load_run_config resolves it).
    model.config is not fingerprinted: the contents are, through the model keys."""
    from slurmtrain.common.hf_config import RUN_COPY
    from slurmtrain.common.schema import plain

    if data is None:
        data = plain(cfg)
    model = data.get("model")
    if not isinstance(model, dict) or not model.get("config"):
        return data
    source = Path(str(model["config"]))
    copy_path = run.path / RUN_COPY
    if source.resolve() != copy_path.resolve():
        replace_atomically(copy_path, source.read_text(), mode=0o640, durable=durable)
    return {**data, "model": {**model, "config": RUN_COPY}}


def runs_named(arg: str, runs_root: Optional[str] = None) -> tuple[list[RunDir], Path]:
    """What a command-line RUN argument names: a run directory (one), or every run directory of
    that run name under runs_root (default $SLURMTRAIN_RUNS_ROOT, else ./runs); and that root."""
    root = Path(runs_root or os.environ.get("SLURMTRAIN_RUNS_ROOT", "runs")).expanduser()
    path = Path(arg).expanduser()
    if RunDir(path).config.is_file():
        return [RunDir(path.resolve())], root
    if "/" in arg:
        return [], root
    return [RunDir(p.parent.resolve()) for p in sorted((root / arg).glob("*/config.yaml"))], root
