"""The N1 check: an async save's fp32 partition, byte for byte, against what DeepSpeed held then.

    python bench/gpu_n1.py [--late-copy] SAVE_STEP OVERRIDE...   # one JSON line (bench/gpu_check.py)

One process trains a slurmtrain run (the login side's resolve/check/record, then the compute
side's attempt.run, as the local executor's task would) with `checkpoint.async_save=true` and a
save at SAVE_STEP, training on past it. Around slurmtrain's own code three observers are put:
- Checkpointer.save at SAVE_STEP clones `engine.optimizer.single_partition_of_fp32_groups` (and
  Adam's moments of each partition) on the device first (ordered on its stream, so the clone is the
  state of that step) and only then saves;
- a global optimizer post-step hook counts, at the next step, the partition's elements that
  changed since: training moved on past the save, so a copy that landed late would show;
- HostPool.run notes each thread that runs the deferred device-to-host copies and its current CUDA
  device (it must be the rank's: a new thread's is 0).
After the run, the published `step_N/` optimizer file's fp32 partition (and moments) are compared
with the clone, byte for byte. This is how the stale-async-save defect (issue 32) shows: the file then holds the
previous save's bytes (zeros at a first save) or a later step's. The rank's device is the last
visible GPU (cuda:7 on an 8-GPU node, the ranks the defect hit; cuda:0 on a 1-GPU machine, where
the async path, the event wait and the thread's device are still what is checked); CPU with
DS_ACCELERATOR=cpu. `--late-copy` is the check's own test: the deferred copies are held back until
the next optimizer step has run, as copies that land late would be, and the check must fail.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

MOMENTS = ("exp_avg", "exp_avg_sq")


def _differing(saved: Any, expected: Any) -> int:
    """Bytes that differ between two tensors (all of them when the shapes do)."""
    import torch

    x, y = saved.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    return y.numel() if x.shape != y.shape else int(torch.ne(x, y).sum())


class Observer:
    """The clone at the save, the changes after it, and the threads that copied to the host."""

    def __init__(self, step: int, late_copy: bool = False) -> None:
        self.step, self.late_copy = step, late_copy
        self.stepped = threading.Event()  # the first optimizer step after the save ran
        self.clone: Optional[list[Any]] = None
        self.moments: list[dict[str, Any]] = []
        self.live: list[Any] = []
        self.changed_after: Optional[int] = None
        self.copy_threads: list[dict[str, object]] = []
        self.device = ""

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from slurmtrain.compute.checkpoint import hostpool, manager

        observer, real_save, real_run = self, manager.Checkpointer.save, hostpool.HostPool.run

        def save(self: Any, engine: Any, step: int, meta: Any, rng: Any) -> None:
            if step == observer.step and observer.clone is None:
                parts = list(engine.optimizer.single_partition_of_fp32_groups)
                observer.live = parts
                observer.clone = [t.detach().clone() for t in parts]
                state = engine.optimizer.optimizer.state  # Adam's moments of each partition
                observer.moments = [
                    {k: state[t][k].detach().clone() for k in MOMENTS if k in state[t]}
                    for t in parts
                ]
                observer.device = str(parts[0].device)
            real_save(self, engine, step, meta, rng)

        def run(self: Any) -> None:
            if self.tasks and observer.late_copy and observer.clone is not None:
                if threading.current_thread() is threading.main_thread():
                    return  # the step's pre-hook: let it go on without the copies
                observer.stepped.wait(120)
            if self.tasks:
                cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
                observer.copy_threads.append(
                    {
                        "thread": threading.current_thread().name,
                        "device": f"cuda:{torch.cuda.current_device()}" if cuda else "cpu",
                        "sources": sorted({str(d) for _, _, d in self.tasks}),
                    }
                )
            real_run(self)

        manager.Checkpointer.save = save  # type: ignore[method-assign]
        hostpool.HostPool.run = run  # type: ignore[method-assign]
        register_optimizer_step_post_hook(self.after_step)

    def after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        import torch

        if self.clone is None or self.changed_after is not None:
            return
        changed = 0
        for live, clone in zip(self.live, self.clone):
            changed += int(torch.ne(live.view(torch.int32), clone.view(torch.int32)).sum())
        self.changed_after = changed
        self.stepped.set()

    def compare(self, run: Path) -> dict[str, Any]:
        """The published optimizer files' fp32 partitions against the clone, byte for byte."""
        import torch

        from slurmtrain.common.checkpoint_format import tag

        found = sorted((run / "checkpoints" / tag(self.step)).glob("*optim_states.pt"))
        if self.clone is None or not found:
            return {"error": f"no clone ({self.clone is None}) or no optimizer file: {found}"}
        state = torch.load(found[0], map_location="cpu", weights_only=False)
        saved = state["optimizer_state_dict"]["single_partition_of_fp32_groups"]
        expected = [t.cpu() for t in self.clone]
        differing = zero = total = 0
        for a, b in zip(saved, expected):
            total += b.numel() * b.element_size()
            differing += _differing(a, b)
            zero += int((a == 0).all())
        # Adam's moments too, where the file holds torch's optimizer state dict (ZeRO-1/2)
        base = state["optimizer_state_dict"].get("base_optimizer_state")
        held = base.get("state") if isinstance(base, dict) else None
        moments: Optional[int] = None
        if isinstance(held, dict) and len(held) == len(self.moments):
            moments = 0
            for i, clones in enumerate(self.moments):
                for key, clone in clones.items():
                    moments += _differing(held[i][key], clone.cpu())
        return {
            "moment_bytes_differing": moments,
            "file": found[0].name,
            "groups": len(expected),
            "fp32_bytes": total,
            "bytes_differing": differing,
            "groups_all_zero": zero,
            "groups_match": len(saved) == len(expected),
        }


def prepare(overrides: list[str]) -> Path:
    """The run directory, written as `python -m slurmtrain` writes it before submitting."""
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema
    from slurmtrain.login.prepare import check, record, resolve

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = resolve(compose("config", overrides=overrides))
    prepared = check(cfg, quiet=True)
    if prepared is None:
        raise SystemExit("the N1 run is finished or running already (runs_root not fresh?)")
    record(prepared, overrides)
    return prepared.run.path


def main() -> int:
    args = sys.argv[1:]
    late = args[:1] == ["--late-copy"]
    step, overrides = int(args[late]), args[late + 1 :]
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_"))]:
        del os.environ[key]  # one plain rank: placement from RANK/WORLD_SIZE/LOCAL_RANK
    os.environ.setdefault("SLURMTRAIN_AUTO", "off")
    cpu = "gpus_per_node=0" in overrides
    if cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"
        local = 0
    else:
        import torch

        local = torch.cuda.device_count() - 1  # the last GPU: never the thread's default 0
    from slurmtrain.login.local_submit import free_port

    port = free_port()
    os.environ.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK=str(local),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    run = prepare(overrides)
    observer = Observer(step, late)
    observer.install()
    from slurmtrain.common import events
    from slurmtrain.common.rundir import RunDir
    from slurmtrain.compute import attempt

    started = time.monotonic()
    code = attempt.run(str(run), port)
    seconds = time.monotonic() - started
    out: dict[str, Any] = {"exit": code, "train_s": round(seconds, 1), "device": observer.device}
    out["save_step"] = step
    saved = [
        r for r in RunDir(run).events() if isinstance(r, events.CheckpointSaved) and r.step == step
    ]
    out["mode"] = saved[-1].mode if saved else None
    out.update(observer.compare(run))
    out["changed_after_save"] = observer.changed_after
    out["copy_threads"] = observer.copy_threads
    devices = {str(t["device"]) for t in observer.copy_threads}
    out["threads_on_rank_device"] = devices <= {observer.device} and bool(devices)
    main = threading.main_thread().name  # else the next step's pre-hook made the copies itself
    out["copied_on_save_thread"] = any(t["thread"] != main for t in observer.copy_threads)
    out["ok"] = bool(
        code == 0
        and out["mode"] == "async"
        and out.get("groups_match")
        and out.get("fp32_bytes")
        and out.get("bytes_differing") == 0
        and out.get("moment_bytes_differing") in (0, None)
        and (observer.changed_after or 0) > 0
        and out["threads_on_rank_device"]
    )
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
