"""The default costs of tools/goodput_sim.py, each with its source: rates measured by the benches
(bench/results/*.txt) scaled to the bytes one node of the opt13b plan saves and loads, and the
planner's own assumptions where nothing was measured (said so). Never a small model's seconds:
only bytes over seconds travel from a bench to a plan of another size.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from slurmtrain.planning import ckpt_interval, policy

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
IO_FILE, TIER_FILE = "checkpoint_io.txt", "local_tier_rates.txt"
FIXED_FILE = "local_tier_fixed.txt"


@dataclass(frozen=True)
class Cost:
    value: float
    source: str


def tier_rates(path: Path = RESULTS / TIER_FILE) -> dict[str, float]:
    """bench/local_tier_rates.py's MB/s: local_write, local_read, buddy_copy, shared_read."""
    found = re.findall(r"^(\w+) MB/s: ([0-9.]+)$", path.read_text(), re.M)
    return {name: float(value) * 1e6 for name, value in found}


def local_fixed_s(path: Path = RESULTS / FIXED_FILE) -> float:
    """bench/local_tier_drill.py's median local save of opt_tiny: the local tier's fixed cost."""
    [value] = re.findall(r"^local_save_fixed s: ([0-9.]+)$", path.read_text(), re.M)
    return float(value)


def io_rates(path: Path = RESULTS / IO_FILE, model: str = "opt125m") -> dict[str, float]:
    """bench/checkpoint_io.py's biggest model: the shared tier's sync write rate (its `write
    MB/s`) and an async save's stall rate (MB a save / blocked s), bytes per second."""
    rows = {}
    for line in path.read_text().splitlines():
        cols = line.split()
        if len(cols) > 8 and cols[0] == model and cols[1] in ("sync", "async"):
            rows[cols[1]] = cols
    return {
        "shared_write": float(rows["sync"][8]) * 1e6,
        "async_stall": float(rows["async"][3]) / float(rows["async"][4]) * 1e6,
    }


def opt13b_node_bytes(nodes: int, gpus: int) -> tuple[float, str]:
    """The bytes one node's ranks save in the opt13b plan on `nodes` x `gpus` (as the dry run
    plans it: the first tensor-parallel degree the recipe's global batch divides)."""
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema
    from slurmtrain.common.errors import ConfigError
    from slurmtrain.login.prepare import resolve

    schema.register()
    for tp, micro in ((1, 2), (2, 1), (4, 1), (8, 1)):
        over = [f"nodes={nodes}", f"gpus_per_node={gpus}", f"parallel.tensor={tp}"]
        over += ["model=opt13b", "cluster=slurm", f"train.micro_batch_size={micro}"]
        with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
            cfg = compose("config", overrides=[*over, "runs_root=/nonexistent"])
        try:
            cfg = resolve(cfg)
        except ConfigError:
            continue
        lay = policy.checkpoint_layout(cfg, nodes)  # type: ignore[arg-type]
        how = f"opt13b plan, {nodes} x {gpus} GPUs, ZeRO-{cfg.deepspeed.stage}, TP {tp}"
        return float(lay.save.node), f"{how}: {lay.save.total / 1e9:.0f} GB a save"
    raise SystemExit(f"goodput_sim: no opt13b plan fits {nodes} x {gpus} GPUs")


def defaults(nodes: int, gpus: int, failures_per_node_day: float) -> dict[str, Cost]:
    """Every cost the simulator's defaults use, in seconds, with where it came from."""
    node_bytes, plan = opt13b_node_bytes(nodes, gpus)
    tier, io = tier_rates(), io_rates()
    mb = f"{node_bytes / 1e6:.0f} MB a node"
    tiers = f"bench/local_tier_rates.py ({TIER_FILE})"
    ios = f"bench/checkpoint_io.py ({IO_FILE}, opt125m)"

    def over(rate: str, where: str, rates: dict[str, float]) -> tuple[float, str]:
        return node_bytes / rates[rate], f"{mb} / {rates[rate] / 1e6:.0f} MB/s {rate}, {where}"

    fixed, startup, local_fixed = policy.SAVE_FIXED_S, policy.STARTUP_S, local_fixed_s()
    fixed_src = f"+ {fixed:g} s fixed (planning/policy.py SAVE_FIXED_S, assumed)"
    local_fixed_src = f"+ {local_fixed:.2f} s fixed (bench/local_tier_drill.py, {FIXED_FILE})"
    up_src = f"{startup:g} s start-up (planning/policy.py STARTUP_S, assumed)"
    write, w_src = over("local_write", tiers, tier)
    buddy, b_src = over("buddy_copy", tiers, tier)
    s_read, r_src = over("shared_read", tiers, tier)
    stall, st_src = over("async_stall", ios + ": MB a save / blocked s, async", io)
    s_write, sw_src = over("shared_write", ios + ", sync", io)
    worst_local = max(buddy, node_bytes / tier["local_read"])  # the replaced node reads its buddy's
    mtbf = ckpt_interval.job_mtbf_seconds(nodes, failures_per_node_day)
    local_save, shared_total = write + buddy + local_fixed, s_write + fixed
    out = {
        "node bytes": Cost(node_bytes, plan),
        "local save": Cost(
            local_save, f"write {w_src}; then the buddy copy {b_src}; {local_fixed_src}"
        ),
        "shared save": Cost(stall, f"async, the loop waits for the host copy: {st_src}"),
        "shared save total": Cost(shared_total, f"until published: {sw_src} {fixed_src}"),
        "restart local": Cost(startup + worst_local, f"{up_src} + the replaced node's {b_src}"),
        "restart shared": Cost(startup + s_read, f"{up_src} + {r_src} (cold, CRC-32 + load)"),
    }
    out["local interval"] = Cost(
        ckpt_interval.young_daly_interval(local_save, mtbf),
        "Young/Daly on the local save (planning/local_tier_plan.py's rule)",
    )
    out["shared interval"] = Cost(
        ckpt_interval.young_daly_interval(shared_total, mtbf),
        "Young/Daly on the shared save until published (planning/policy.py's rule)",
    )
    assert all(math.isfinite(c.value) and c.value > 0 for c in out.values())
    return out
