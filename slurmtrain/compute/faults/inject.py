"""Fault injection for tests and drills, from `SLURMTRAIN_INJECT="key=value,..."` (compute node).

Real failures are rare and slow to wait for; these make them happen on cue through the real code
path: `step_delay=S`, `crash_at_step=N`, `stall_at_step=N` (+`stall_rank=R`), `slow_rank=R` or
`slow_node=NODE` (+`slow_factor=F`: that rank, or every rank on that node, takes F times as long in
its forward and backward: observe/stragglers.py; it stays with the node name), `bad_node=NODE` / `bad_rank=R` (health gate), `bad_storage_node=NODE` (the
gate's storage probe sees the run's mounts read-only there: health.py), `kill_during_save=N` (SIGKILL
after the first shard of step N's save), `shard_delay=S`, `nan_at_step=N` (+`nan_rank`,
`nan_repeat=1`), `fail_before_start=1`, `absent_rank=R` (SIGSTOP before the rendezvous, once per
run). `attempts=1+2` confines them to those attempts; `name_suffix=-smoke` to runs so named.

Only a run with `faults.allow_inject=true` is injected: the login node refuses the variable without
it and the batch script unsets it, so production never inherits a drill's setting.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Mapping, Optional

from slurmtrain.common.inject_spec import parse
from slurmtrain.common.rundir import RunDir


def settings(env: Mapping[str, str] = os.environ, allowed: bool = False) -> dict[str, str]:
    """The injections asked for; none unless the run opted in (faults.allow_inject)."""
    return parse(env) if allowed else {}


class Injector:
    def __init__(
        self,
        rank: int,
        env: Mapping[str, str] = os.environ,
        attempt: Optional[int] = None,
        name: Optional[str] = None,
        allowed: bool = False,
    ) -> None:
        self.rank = rank
        self.poisoned: set[int] = set()
        self.cfg = settings(env, allowed)
        only = self.cfg.get("attempts")
        if only and attempt is not None and str(attempt) not in only.split("+"):
            self.cfg = {}
        suffix = self.cfg.get("name_suffix")
        if suffix and name is not None and not name.endswith(suffix):
            self.cfg = {}

    def fails_health(self, node: str) -> bool:
        return self.cfg.get("bad_node") in (node, "*") or self.cfg.get("bad_rank") == str(self.rank)

    def fails_storage(self, node: str) -> bool:
        """`bad_storage_node`: this node's storage probe is to see the run's mounts read-only."""
        return self.cfg.get("bad_storage_node") in (node, "*")

    def slowdown(self, node: str) -> float:
        """`slow_rank`/`slow_node`: how many times as long this rank's compute is to take (1.0:
        not slowed; slow_factor defaults to 3 for a rank, 1.5 for a node)."""
        cfg = self.cfg
        if cfg.get("slow_rank") == str(self.rank):
            return float(cfg.get("slow_factor", "3"))
        if cfg.get("slow_node") in (node, "*"):
            return float(cfg.get("slow_factor", "1.5"))
        return 1.0

    def get(self, key: str) -> Optional[str]:
        return self.cfg.get(key)

    def poison(self, step: int) -> bool:
        """Whether this rank's loss of `step` is to be made NaN (a divergence on cue)."""
        cfg = self.cfg
        if cfg.get("nan_at_step") != str(step) or cfg.get("nan_rank", str(self.rank)) != str(
            self.rank
        ):
            return False
        if step in self.poisoned and cfg.get("nan_repeat") != "1":
            return False
        self.poisoned.add(step)
        return True

    def before_start(self) -> None:
        if self.cfg.get("fail_before_start"):
            raise RuntimeError("injected failure before the attempt started")

    def after_step(self, step: int, step_seconds: float) -> None:
        cfg = self.cfg
        if not cfg:
            return
        if "step_delay" in cfg:
            time.sleep(float(cfg["step_delay"]))
        if cfg.get("crash_at_step") == str(step):
            raise RuntimeError(f"injected crash at step {step}")
        if cfg.get("stall_at_step") == str(step) and cfg.get("stall_rank", "0") == str(self.rank):
            while True:
                time.sleep(3600)

    def after_shard(self, step: int, name: str) -> None:
        """Called by the checkpoint writer after each shard file is on disk (any thread)."""
        cfg = self.cfg
        if not cfg:
            return
        if "shard_delay" in cfg:
            time.sleep(float(cfg["shard_delay"]))
        if cfg.get("kill_during_save") == str(step):
            os.kill(os.getpid(), signal.SIGKILL)


def wedge_before_rendezvous(
    rank: int, run_dir: Path, allowed: bool, env: Mapping[str, str] = os.environ
) -> None:
    """`absent_rank=R`: rank R stops (SIGSTOP: its watchdog too) before the rendezvous, the first
    time only (a marker in the run directory): the attempt number is not known yet, and the
    restart, on other nodes, must get through."""
    if settings(env, allowed).get("absent_rank") != str(rank):
        return
    try:
        os.close(os.open(RunDir(run_dir).injected("absent_rank"), os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGSTOP)
