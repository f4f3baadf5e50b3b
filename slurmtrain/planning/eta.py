"""How long a run still needs, and in how many walltime-limited Slurm attempts.

Pure arithmetic from a measured (or assumed) throughput, so the login node can say "3 attempts,
ETA 9h40m" before submitting and `status` can say it again from the ledger. Queue waits are not
knowable here and are left out: the ETA is time spent holding the nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from slurmtrain.common.errors import ConfigError
from slurmtrain.common.slurm_text import parse_time


@dataclass(frozen=True)
class Eta:
    """The remaining work, split into compute, checkpoint saves and restarts (all in seconds)."""

    current_step: int
    max_steps: int
    remaining_steps: int
    step_time_s: float
    compute_s: float
    saves: int  # periodic + final saves still to come (not the ones a requeue signal forces)
    checkpoint_s: float  # blocking time of every save still to come, forced ones included
    attempts: int  # Slurm allocations still needed, this one included
    restart_s: float  # startup (rendezvous, health gate, checkpoint load) of every attempt
    total_s: float
    time_limit_s: Optional[float]


def slurm_time_seconds(text: str, key: str = "cluster.time") -> Optional[float]:
    """Slurm --time in seconds (slurm.parse_time's forms); None when unlimited; ConfigError if bad."""
    try:
        seconds = parse_time(text)
    except ValueError:
        raise ConfigError(
            f"{key}={text!r}: not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS "
            f"(e.g. {key}=04:00:00)"
        ) from None
    return None if seconds is None else float(seconds)


def _saves(current: int, last: int, every: int, final: bool) -> int:
    """Saves at multiples of `every` in (current, last], plus one at `last` if it is not one."""
    periodic = last // every - current // every if every else 0
    return periodic + (1 if final and last > current and (not every or last % every) else 0)


def _save_interval_steps(every_steps: int, every_s: float, step_time: float) -> int:
    """Steps between periodic saves: the step and time intervals, whichever comes first (0: none)."""
    if not every_s:
        return every_steps
    by_time = max(1, int(every_s // step_time))
    return min(every_steps, by_time) if every_steps else by_time


def _attempts(
    work: float, time_limit_s: Optional[float], restart_overhead_s: float, stop_early_s: float
) -> int:
    """Allocations `work` seconds of training and saving need: each loses its start-up and the
    `stop_early_s` it stops before the limit to save; no limit means one allocation does it all."""
    if time_limit_s is None:
        return 1
    usable = time_limit_s - restart_overhead_s - stop_early_s
    if usable <= 0:
        raise ConfigError(
            f"cluster.time={time_limit_s:.0f}s: leaves no training time after restart "
            f"overhead ({restart_overhead_s:.0f}s) and the final save "
            f"({stop_early_s:.0f}s); raise cluster.time"
        )
    return max(1, math.ceil(work / usable))


def estimate_eta(
    *,
    current_step: int,
    max_steps: int,
    tokens_per_step: float,
    tokens_per_s: float,
    time_limit_s: Optional[float] = None,
    restart_overhead_s: float = 0.0,
    save_s: float = 0.0,
    save_every_steps: int = 0,
    save_every_s: float = 0.0,
    signal_lead_s: float = 0.0,
    save_final: bool = True,
    signal_save_s: Optional[float] = None,
) -> Eta:
    """Time from `current_step` to `max_steps` at `tokens_per_s` (whole job).

    tokens_per_step is the global batch x seq_len. Each attempt pays `restart_overhead_s` and
    stops training `max(signal_lead_s, save_s)` before its limit to save (the USR2 protocol); the
    attempts needed are the compute plus periodic saves divided by what is left of each
    allocation. Time- and step-based save intervals combine as "whichever comes first".
    `signal_save_s`: the save a time-limit signal forces (synchronous; default `save_s`, which
    for async saves is only what the loop waits for).
    """
    if tokens_per_s <= 0 or tokens_per_step <= 0:
        raise ConfigError(
            f"tokens_per_s={tokens_per_s}, tokens_per_step={tokens_per_step}: "
            f"throughput and batch must be positive to estimate an ETA"
        )
    forced_s = save_s if signal_save_s is None else signal_save_s
    if min(restart_overhead_s, save_s, save_every_s, signal_lead_s, save_every_steps, forced_s) < 0:
        raise ConfigError("ETA inputs: overheads and save intervals must be >= 0")
    remaining = max(0, max_steps - current_step)
    step_time = tokens_per_step / tokens_per_s
    compute = remaining * step_time
    every = _save_interval_steps(save_every_steps, save_every_s, step_time)
    saves = _saves(current_step, max(current_step, max_steps), every, save_final)
    work = compute + saves * save_s
    attempts = (
        _attempts(work, time_limit_s, restart_overhead_s, max(signal_lead_s, forced_s))
        if remaining
        else 0
    )
    forced = max(0, attempts - 1) * forced_s  # the save each requeue signal triggers
    restarts = attempts * restart_overhead_s
    return Eta(
        current_step=current_step,
        max_steps=max_steps,
        remaining_steps=remaining,
        step_time_s=step_time,
        compute_s=compute,
        saves=saves,
        checkpoint_s=saves * save_s + forced,
        attempts=attempts,
        restart_s=restarts,
        total_s=work + forced + restarts,
        time_limit_s=time_limit_s,
    )


def format_duration(seconds: float, clock: bool = False) -> str:
    """The one duration formatter (negative counts as 0). Compact for plans and reports: 45s,
    3m20s, 5h12m, 2d03h; `clock` for log lines, whose width stays steady: 0:00:45, 1d 2:03:04."""
    s = int(round(max(seconds, 0.0)))
    if clock:
        days, rest = divmod(s, 86400)
        text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
        return f"{days}d {text}" if days else text
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_eta(eta: Eta) -> str:
    """One line, e.g. 'ETA 9h40m: 9000 steps x 3.40 s; 3 attempts of 4h00m; 19 saves, 9m30s'."""
    if eta.remaining_steps == 0:
        return f"ETA 0s: step {eta.current_step} already at max_steps={eta.max_steps}"
    limit = (
        f"{eta.attempts} attempt{'s' if eta.attempts != 1 else ''} of "
        f"{format_duration(eta.time_limit_s)}"
        if eta.time_limit_s is not None
        else "1 attempt (no time limit)"
    )
    return (
        f"ETA {format_duration(eta.total_s)}: {eta.remaining_steps} steps x "
        f"{eta.step_time_s:.2f} s = {format_duration(eta.compute_s)}; {limit}, restarts "
        f"{format_duration(eta.restart_s)}; {eta.saves} saves, checkpoints "
        f"{format_duration(eta.checkpoint_s)}"
    )
