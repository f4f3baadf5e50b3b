"""Fault injection for tests and drills, from `SLURMTRAIN_INJECT="key=value,..."` (compute node).

Real failures are rare and slow to wait for; these hooks make them happen on cue through the real
code path: `step_delay=0.2` (seconds added to every step), `crash_at_step=N`, `stall_at_step=N` with
`stall_rank=R` (sleeps forever), `slow_rank=R` with `slow_factor=F`, `bad_node=NODE` (health gate).
"""

from __future__ import annotations

import os
import time
from typing import Mapping, Optional


def settings(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    text = env.get("SLURMTRAIN_INJECT", "").strip()
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, v in pairs}


class Injector:
    def __init__(self, rank: int, env: Mapping[str, str] = os.environ) -> None:
        self.rank = rank
        self.cfg = settings(env)

    def get(self, key: str) -> Optional[str]:
        return self.cfg.get(key)

    def after_step(self, step: int, step_seconds: float) -> None:
        cfg = self.cfg
        if not cfg:
            return
        if "step_delay" in cfg:
            time.sleep(float(cfg["step_delay"]))
        if cfg.get("slow_rank") == str(self.rank):
            time.sleep(step_seconds * (float(cfg.get("slow_factor", "3")) - 1))
        if cfg.get("crash_at_step") == str(step):
            raise RuntimeError(f"injected crash at step {step}")
        if cfg.get("stall_at_step") == str(step) and cfg.get("stall_rank", "0") == str(self.rank):
            while True:
                time.sleep(3600)
