"""Sweeps as one job array that returns at once.

Hydra's own submitit launcher blocks until every job ends. This one composes every sweep point,
validates and plans all of them before anything is queued (one bad point: nothing submitted), skips
points already finished or running (each point has its own run directory and fingerprint), and
submits the rest as a single `sbatch --array` (cluster=slurm) or runs them one after the other
(cluster=local).
"""

import atexit
import functools
import gc
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


@dataclass
class SlurmtrainLauncherConf:
    _target_: str = "hydra_plugins.slurmtrain_launcher.launcher.SlurmtrainLauncher"


ConfigStore.instance().store(
    group="hydra/launcher", name="slurmtrain", node=SlurmtrainLauncherConf, provider="slurmtrain"
)


class SlurmtrainLauncher(Launcher):
    def __init__(self, **_: object) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self._cache: dict[tuple[str, ...], bytes] = {}  # composed base per structural overrides
        self._parsed: dict[str, Override] = {}
        self._groups: Optional[set[str]] = None
        self._parser: Optional[OverridesParser] = None
        self._cli: Optional[tuple[Optional[tuple[str, ...]]]] = None  # see _command_line
        self._given_lines: Optional[frozenset[str]] = None  # see _given

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """The same flow as a single run (slurmtrain.login.launch), for every point at once.

        Git, the installed packages and Slurm are asked in the background while the points are
        composed (launch.warm_up), and Python's cyclic garbage collector is paused meanwhile: every
        point's config stays alive until the sweep is queued, so its passes would find nothing to
        free and only re-walk all of them, again and again (~10% of a 64-point sweep)."""
        from slurmtrain.login import launch  # start-up speed: Hydra imports every plugin

        assert self.config is not None and self.hydra_context is not None
        _skip_final_collection()
        collecting = gc.isenabled()
        gc.disable()
        try:
            ready = launch.warm_up(self._kind())
            points = [(self._compose(list(o)), list(o)) for o in job_overrides]
            code = launch.launch(points, ready=ready)
        finally:
            if collecting:
                gc.enable()
        if code:  # Hydra keeps a job's return value to itself: a refused dry run point exits 2
            raise SystemExit(code)
        return [_done(o, code) for o in job_overrides]

    def _kind(self) -> str:
        """cluster.kind as the sweep's command line set it (a point may still change it)."""
        try:
            assert self.config is not None
            return str(OmegaConf.select(self.config, "cluster.kind", default=""))
        except Exception:  # noqa: BLE001  an unresolvable value: each point reports it
            return ""

    def _compose(self, overrides: list[str]) -> DictConfig:
        """Hydra composes each point in ~80 ms; points differing only in plain values (the usual
        sweep: lr, seed, batch) reuse one composition per choice of config groups instead (the
        command line's, which Hydra has composed already, or one composed here): a clone of it (a
        pickle round trip: typed nodes and flags kept, ~4x cheaper than DictConfig.copy) with the
        point's values set through OmegaConf (so typed keys still check and convert them)."""
        assert self.config is not None and self.hydra_context is not None
        parsed = [self._parse(line) for line in overrides]
        plain = [o for o in parsed if self._is_plain(o)]
        structural = tuple(str(o.input_line) for o in parsed if o not in plain)
        cloned = structural == self._command_line()
        if cloned:  # the command line's own values are in the clone already (the name, runs_root)
            plain = [o for o in plain if o.input_line not in self._given()]
        blob = self._cache.get(structural)
        if blob is None:
            base = self._clone_command_line() if cloned else None
            if base is None:
                loader = self.hydra_context.config_loader
                base = loader.load_sweep_config(self.config, list(structural))
            OmegaConf.set_struct(base, False)
            base.pop("hydra", None)  # big, unused by us, and every copy would pay for it
            OmegaConf.set_struct(base, True)
            blob = self._cache[structural] = pickle.dumps(base, protocol=pickle.HIGHEST_PROTOCOL)
        cfg: DictConfig = pickle.loads(blob)
        for o in plain:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        return cfg

    def _command_line(self) -> Optional[tuple[str, ...]]:
        """The command line's own structural overrides, as the sweeper writes them into each
        point, when setup's config (Hydra's composition of the command line, sweeps left out) is
        what Hydra would compose for such a point: no config group left to the sweep (`???`).
        None otherwise: every point is then composed by Hydra."""
        if self._cli is None:
            self._cli = (None,)
            try:
                assert self.config is not None
                choices = OmegaConf.to_container(self.config.hydra.runtime.choices)
                if isinstance(choices, dict) and "???" not in choices.values():
                    parsed = [self._parse(line) for line in self.config.hydra.overrides.task]
                    self._cli = (
                        tuple(
                            f"{o.get_key_element()}={o.get_value_element_as_str()}"
                            for o in parsed
                            if not o.is_sweep_override() and not self._is_plain(o)
                        ),
                    )
            except Exception:  # noqa: BLE001  unexpected shape: compose every point instead
                self._cli = (None,)
        return self._cli[0]

    def _given(self) -> frozenset[str]:
        """The command line's overrides, as Hydra composed setup's config from them."""
        if self._given_lines is None:
            assert self.config is not None
            self._given_lines = frozenset(str(line) for line in self.config.hydra.overrides.task)
        return self._given_lines

    def _clone_command_line(self) -> Optional[DictConfig]:
        """A copy of Hydra's composition of the command line (None: Hydra composes instead)."""
        try:
            clone: DictConfig = pickle.loads(
                pickle.dumps(self.config, protocol=pickle.HIGHEST_PROTOCOL)
            )
            return clone
        except Exception:  # noqa: BLE001  e.g. an unpicklable value: let Hydra compose it
            return None

    def _parse(self, line: str) -> Override:
        """One parsed override per distinct text: a sweep's points share all but a few. A plain
        number for a plain key (`optim.lr=0.0003`, the usual sweep value: its own text for every
        point) made as Hydra's grammar makes it, without its parser (~1 ms a line)."""
        if line not in self._parsed:
            number = _NUMBER.fullmatch(line)
            if number is not None:
                key, text, point = number.groups()
                self._parsed[line] = Override(
                    type=OverrideType.CHANGE,
                    key_or_group=key,
                    value_type=ValueType.ELEMENT,
                    _value=float(text) if point else int(text),
                    input_line=line,
                )
                return self._parsed[line]
            if self._parser is None:
                self._parser = OverridesParser.create()
            [self._parsed[line]] = self._parser.parse_overrides([line])
        return self._parsed[line]

    def _is_plain(self, o: Override) -> bool:
        """A plain value for a config key (not a config group, a package, a deletion, hydra.*)."""
        from slurmtrain.common.schema import conf_dir  # start-up speed, as in launch()

        if self._groups is None:
            self._groups = {p.name for p in Path(conf_dir()).iterdir() if p.is_dir()}
        return (
            o.type == OverrideType.CHANGE
            and o.package is None
            and o.value_type == ValueType.ELEMENT
            and o.key_or_group not in self._groups
            and not o.key_or_group.startswith("hydra")
        )


# `key.path=NUMBER`: Hydra's INT (no leading zero) or FLOAT with digits on both sides of the point
# and/or an exponent; anything else (1_000, .5, inf, quoted, hydra.*, +key) goes to its parser.
_NUMBER = re.compile(
    r"((?!hydra\b)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)="
    r"(-?(?:(?:0|[1-9]\d*)|(\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)))"
)


@functools.lru_cache(maxsize=1)
def _skip_final_collection() -> None:
    """At exit, before the interpreter's last cyclic collection walks every object still alive
    (all the points' configs: ~0.4 s after a 64-point sweep), move them out of its reach: they are
    freed with the process. Nothing changes before exit, so a long-lived caller leaks nothing."""
    atexit.register(gc.freeze)


def _done(overrides: Sequence[str], value: int) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = value
    return ret
