"""The Trainer: one attempt's training, read top to bottom: build, resume, loop, outcome, teardown.

Each component is built from its own config section (checkpoint.*, train.*, data.*); the Trainer
only wires them together. Every rank runs every method (they are collective where DeepSpeed is).
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any, Optional

from slurmtrain.common import errors
from slurmtrain.common import ledger as faults
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import grad_accumulation
from slurmtrain.compute.distributed import Placement
from slurmtrain.compute.faults import signals
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.compute.faults.watchdog import Watchdog


def rng_state() -> dict[str, Any]:
    """Every generator a step may draw from (dropout, sampling): saved with each checkpoint."""
    import random

    import numpy as np
    import torch

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    if state:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


def broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Trainer:
    """Train one attempt of a run until it finishes, pauses or is told to stop."""

    def __init__(
        self,
        cfg: Any,
        run: RunDir,
        where: Placement,
        attempt: Any,
        flags: signals.SignalFlags,
        injector: Injector,
        watchdog: Watchdog,
    ) -> None:
        import torch

        self.cfg, self.run, self.where, self.attempt = cfg, run, where, attempt
        self.flags, self.injector, self.watchdog = flags, injector, watchdog
        self.rank, self.world = where.rank, where.world_size
        # GPUs: the device attempt.py selected (compute.distributed.rank_device): with one GPU bound
        # per task it is cuda:0 whatever the local rank.
        self.device = (
            torch.device("cpu")
            if cfg.gpus_per_node == 0
            else torch.device("cuda", torch.cuda.current_device())
        )
        self.start_step = 0

    def fit(self) -> int:
        """The whole attempt; returns the process exit code for the batch-shell supervisor."""
        self.build()
        self.resume()
        outcome = self.loop()
        code = self.outcome(outcome)
        self.teardown()
        return code

    # ---- build ---------------------------------------------------------------------------------
    def build(self) -> None:
        """Pick the checkpoint to resume, then the DeepSpeed engine, checkpointer and data."""
        import deepspeed

        from slurmtrain.common import ds_config
        from slurmtrain.compute import data, model
        from slurmtrain.compute.checkpoint import format as ckpt
        from slurmtrain.compute.checkpoint.manager import Checkpointer
        from slurmtrain.compute.observe.memory import MemoryCheck
        from slurmtrain.compute.observe.metrics import MetricsWriter

        cfg, run = self.cfg, self.run
        found = (
            ckpt.find_resumable(run.checkpoints, full=cfg.checkpoint.verify == "checksum")
            if self.rank == 0
            else None
        )
        self.found = broadcast(found)
        for path, reason in self.found.skipped:
            self.attempt.record("checkpoint_skipped", path=path, reason=reason)
            if self.rank == 0:
                print(f"slurmtrain: skipping checkpoint {path}: {reason}", file=sys.stderr)

        self.ds_config = ds_config.build(cfg, self.world, profile_dir=str(run.profile))
        self.load_dir, self.same_world = self.found.path, True
        if (
            self.found.path is not None
            and int(self.found.manifest.get("world_size", self.world)) != self.world
        ):
            # Written by another world size: load DeepSpeed's universal form (converted once,
            # cached); the global batch is fixed, grad accumulation adjusted; RNG is per rank.
            from slurmtrain.compute.checkpoint import reshape

            self.load_dir = reshape.for_world(
                self.found, self.rank, self.world, self.attempt.record, cfg.checkpoint.verify
            )
            self.ds_config.setdefault("checkpoint", {})["load_universal"] = True
            self.same_world = False
        self.memory = MemoryCheck(cfg, self.device, self.rank, self.world, self.attempt.record)
        self.memory.start()
        self.net = model.build(cfg, self.ds_config, self.device)
        self.engine, _, _, _ = deepspeed.initialize(
            model=self.net, model_parameters=self.net.parameters(), config=self.ds_config
        )
        c = cfg.checkpoint
        self.checkpointer = Checkpointer(
            run.checkpoints,
            self.rank,
            self.world,
            c.verify,
            async_save=c.async_save,
            keep_last=c.keep_last,
            keep_every=c.keep_every,
            stop_on_error=c.on_save_error == "stop",
            record=self.attempt.record,
            hook=self.injector.after_shard,
            timeout_s=c.publish_timeout_minutes * 60,
        )
        self.checkpointer.attach(self.engine)
        self.tokens = data.load_tokens(cfg.data.kind, cfg.data.path, cfg.data.max_corpus_bytes)
        self.sampler = data.Sampler(len(self.tokens), cfg.data.seq_len, cfg.data.seed)
        self.metrics = MetricsWriter(
            run.metrics,
            self.rank == 0,
            self.attempt.number,
            run.tensorboard / f"attempt_{self.attempt.number}",
            print_lines=self.rank == 0,
        )

    # ---- resume --------------------------------------------------------------------------------
    def resume(self) -> None:
        """Load the chosen checkpoint (weights, optimizer, scheduler, RNG) on every rank."""
        if self.found.path is None or self.load_dir is None:
            return
        t0 = time.time()
        set_rng_state(
            self.checkpointer.load(self.engine, self.load_dir, restore_rng=self.same_world)
        )
        self.start_step = int(self.found.manifest["step"])
        self.watchdog.beat("checkpoint load")
        self.attempt.record(
            "checkpoint_loaded",
            step=self.start_step,
            seconds=time.time() - t0,
            path=str(self.load_dir),
            world_size_changed=not self.same_world,
        )

    # ---- loop ----------------------------------------------------------------------------------
    def save(self, step: int) -> None:
        """A collective save; the checkpointer records saved/failed events and prunes."""
        gbs = self.cfg.train.global_batch_size
        consumed = step * gbs
        meta = {
            "world_size": self.world,
            "consumed_samples": consumed,
            "zero_stage": self.cfg.deepspeed.stage,
            "data_position": {
                "consumed_samples": consumed,
                "epoch": consumed // self.sampler.num_samples,
            },
        }
        self.checkpointer.save(self.engine, step, meta, rng_state())

    def on_step(self, step: int, seconds: float) -> None:
        self.attempt.step = step
        self.watchdog.beat(f"step {step}")
        self.memory.after_step(step)
        self.injector.after_step(step, seconds)

    def loop(self) -> Any:
        from slurmtrain.compute import loop
        from slurmtrain.compute.observe.perf import Perf

        cfg = self.cfg
        state = loop.LoopState(self.start_step, self.start_step, time.time())
        pause = cfg.train.pause_at_step if self.start_step < cfg.train.pause_at_step else None
        try:
            tracker = Perf(
                self.engine,
                cfg,
                self.world,
                self.rank,
                self.device,
                self.where.node,
                self.attempt.record,
                self.run.path,
            )
            return loop.train(
                self.engine,
                cfg,
                self.tokens,
                self.sampler,
                state,
                self.world,
                self.rank,
                self.device,
                self.metrics,
                self.flags,
                self.save,
                tracker,
                accum=grad_accumulation(cfg, self.world),
                on_step=self.on_step,
                stop_at=pause,
            )
        except BaseException:
            self.checkpointer.abandon()  # an async save already copied may still publish
            raise
        finally:
            self.memory.stop()
            self.metrics.close()

    # ---- outcome -------------------------------------------------------------------------------
    def outcome(self, outcome: Any) -> int:
        """Record how the attempt ended; the exit code tells the supervisor what to do next."""
        self.checkpointer.settle()  # async: the last save is published (or failed) on every rank
        final: Optional[Any] = self.checkpointer.last
        stopped = outcome.stop_code != signals.NONE
        if not stopped and final is not None and not final.ok and final.step == outcome.step:
            # Training reached its end but its final state is not on disk: not finished.
            self.attempt.record(
                "failed",
                **{
                    "class": faults.CRASH,
                    "step": outcome.step,
                    "error": f"final checkpoint not saved: {final.error}",
                },
            )
            return 1
        if not stopped and outcome.step < self.cfg.train.max_steps:
            self.attempt.record(
                "paused", step=outcome.step
            )  # train.pause_at_step: next job resumes
            return 0
        if not stopped:
            self.attempt.record("finished", step=outcome.step)
            return 0
        self.attempt.record(
            "signal",
            signal=self.flags.received,
            step=outcome.step,
            received_at=self.flags.received_at,
        )
        # The supervisor restarts a time-limited run, and asks Slurm whether a SIGTERM was a
        # preemption (restart) or a scancel (stop).
        return (
            errors.EXIT_REQUEUE
            if outcome.stop_code == signals.TIME_LIMIT
            else errors.EXIT_TERMINATED
        )

    # ---- teardown ------------------------------------------------------------------------------
    def teardown(self) -> None:
        """ZeRO-3 aborts at interpreter exit in ~7% of runs unless torn down in this order."""
        self.engine.destroy()
        del self.engine, self.net
        gc.collect()
