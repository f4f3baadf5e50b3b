"""The Trainer: one attempt's training, read top to bottom: choose, build, resume, loop, outcome.

choose: which checkpoint (or a stop, `checkpoint_unreadable`, before anything is built); resume:
one that fails to load is marked and the previous one loaded (recovery.py); loop: a diverged step
rolls back in-process (recovery.py), skipping the data window (or stops `diverged`); outcome: a
stop signal in the final step finishes the run rather than asking for another job.

Each component is built from its own config section plus the RankContext; the Trainer only wires
them together. Every rank runs every method (they are collective where DeepSpeed is).
"""

from __future__ import annotations

import gc
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from slurmtrain.common import events, ledger
from slurmtrain.common.checkpoint_format import Resume
from slurmtrain.common.derived import grad_accumulation, tensor_parallel
from slurmtrain.common.events import FailureClass
from slurmtrain.common.rundir import RunDir
from slurmtrain.common.schema import RootConfig
from slurmtrain.compute import io_count
from slurmtrain.compute.checkpoint.rng import rng_state
from slurmtrain.compute.context import Attempt, RankContext
from slurmtrain.compute.faults import signals
from slurmtrain.compute.faults.inject import Injector
from slurmtrain.planning.deadlines import (
    BUILD,
    CONVERT,
    EVAL,
    listed,
    planned_save,
    planned_state_bytes,
)

if TYPE_CHECKING:
    import torch
    from deepspeed import DeepSpeedEngine

    from slurmtrain.compute.checkpoint.manager import Checkpointer, Meta
    from slurmtrain.compute.data import Data, Sampler, Tokens
    from slurmtrain.compute.divergence import Divergence
    from slurmtrain.compute.loop import Outcome
    from slurmtrain.compute.observe.memory import MemoryCheck
    from slurmtrain.compute.observe.metrics import MetricsWriter
    from slurmtrain.planning.deadlines import Deadlines


class Trainer:
    """Train one attempt of a run until it finishes, pauses or is told to stop."""

    # Set by choose, build and resume (recovery.py reads and moves them).
    deadlines: Deadlines
    found: Resume
    load_dir: Optional[Path]
    same_world: bool
    engine: DeepSpeedEngine
    net: torch.nn.Module
    checkpointer: Checkpointer
    memory: MemoryCheck
    metrics: MetricsWriter
    data: Data
    tokens: Tokens
    sampler: Sampler

    def __init__(
        self,
        cfg: RootConfig,
        run: RunDir,
        ctx: RankContext,
        attempt: Attempt,
        flags: signals.SignalFlags,
        injector: Injector,
    ) -> None:
        self.cfg, self.run, self.ctx, self.attempt = cfg, run, ctx, attempt
        self.flags, self.injector, self.watchdog = flags, injector, ctx.watchdog
        self.rank, self.world, self.device = ctx.rank, ctx.world, ctx.device
        self.start_step = 0
        self.stop: Optional[tuple[str, str]] = None  # (class, error): stop the run, no restart
        self.signalled = False

    def fit(self) -> int:
        """The whole attempt; returns the process exit code for the batch-shell supervisor."""
        self.choose()
        self._mark("choose")
        if self.stop is not None:  # nothing is built, nothing trained
            return self.stopped()
        self.build()
        self.resume()
        self._mark("load")
        if self.stop is not None:  # no checkpoint left that loads
            self.memory.stop()
            self.metrics.close()
            code = self.stopped()
        else:
            self.watchdog.phase("step", self.deadlines.step_s, "start-up")
            code = self.outcome(self.loop())
        self.metrics.finish()  # trackers: after the outcome's events (finished, signal)
        self.teardown()
        return code

    # ---- choose --------------------------------------------------------------------------------
    def choose(self) -> None:
        """Rank 0 picks the checkpoint (checkpoint/select.py); with checksums every rank verifies
        its own files of each candidate (checkpoint/verify.py); every rank learns the choice."""
        from slurmtrain.compute.checkpoint import local_resume, verify

        choice, self.deadlines = verify.choose(
            self.cfg,
            self.run,
            self.rank,
            self.world,
            self.watchdog,
            self.attempt.record,
            self.attempt.rows,  # rank 0: the run tier, read once at the start
        )
        self.ctx = replace(self.ctx, deadlines=self.deadlines)  # the checkpointer's IO phases
        self.found = choice.found
        if self.cfg.checkpoint.local_every_steps > 0 and choice.stop is None:  # issue 38
            self.found = local_resume.choose(
                self.cfg.checkpoint, self.run.path, self.rank, self.world, self.found,
                self.attempt.record, discard=choice.applied is not None,
            )  # fmt: skip
        for path, reason in self.found.skipped:
            self.attempt.record(events.CheckpointSkipped(path=path, reason=reason))
            if self.rank == 0:
                print(f"slurmtrain: skipping checkpoint {path}: {reason}", file=sys.stderr)
        if choice.applied is not None:
            self.attempt.record(choice.applied)
        if choice.stop is not None:
            self.stop = (FailureClass.checkpoint_unreadable, choice.stop)

    def stopped(self) -> int:
        """Stop the run (`stopped`, its class and error line): the supervisor does not restart it."""
        cls, error = self.stop or (FailureClass.crash, "?")
        self.attempt.record(events.Stopped(cls=cls, error=error, step=self.attempt.step))
        if self.rank == 0:
            print(f"slurmtrain: stopping the run ({cls}): {error}", file=sys.stderr)
        return 0

    # ---- build ---------------------------------------------------------------------------------
    def build(self) -> None:
        """The DeepSpeed engine (for the chosen checkpoint's world size), checkpointer and data."""
        import deepspeed

        from slurmtrain.common import ds_config
        from slurmtrain.compute import data, deepspeed_compat, parallel, resume_build
        from slurmtrain.compute.checkpoint import local_tier
        from slurmtrain.compute.checkpoint.manager import Checkpointer
        from slurmtrain.compute.observe.memory import MemoryCheck

        cfg, run, limits = self.cfg, self.run, self.deadlines
        self.ds_config = ds_config.build(cfg, self.world, profile_dir=str(run.profile))
        self._choose_load_dir()
        self.watchdog.phase(BUILD, limits.build_s(planned_state_bytes(cfg, self.world)))
        self.memory = MemoryCheck(cfg, self.ctx)
        self.memory.start()
        skip = resume_build.skips_init(cfg, self.found.path is not None, self.same_world)
        mpu = parallel.mpu(cfg)  # TP/SP: DeepSpeed's groups (data-parallel size = world / TP / SP)
        self.net = resume_build.build(cfg, self.ds_config, self.device, skip_init=skip, mpu=mpu)
        self._mark("build", build_skipped_init=skip)
        deepspeed_compat.skip_muon_compile()  # Muon's import compiles kernels: seconds per start
        self.engine, _, _, _ = deepspeed.initialize(
            model=self.net,
            model_parameters=self.net.parameters(),
            config=self.ds_config,
            lr_scheduler=ds_config.lr_scheduler(cfg),  # metaseq's: not expressible in the dict
            mpu=mpu,
        )
        self.checkpointer = Checkpointer(
            cfg.checkpoint,
            self.ctx,
            run.checkpoints,
            hook=self.injector.after_shard,
            planned_bytes=planned_save(cfg, self.world, limits.nodes),
            protect=ledger.rolled_back_to(self.attempt.rows),  # rank 0 prunes: it has the rows
        )
        self.checkpointer.attach(self.engine)
        self.local = local_tier.open_tier(
            cfg.checkpoint, run.path, self.rank, self.world, self.checkpointer
        )
        self.data = data.load(cfg.data)  # training windows + sampler, held-out windows
        self.tokens, self.sampler = self.data.train, self.data.sampler
        self.metrics = self._metrics_writer()
        self._mark("deepspeed_init")

    def _choose_load_dir(self) -> None:
        """The chosen checkpoint, or (another world size's) its universal form (converted once,
        cached): the global batch is fixed, grad accumulation adjusted; RNG is per rank."""
        found, self.load_dir, self.same_world = self.found, self.found.path, True
        if found.path is None or int(found.manifest.get("world_size", self.world)) == self.world:
            return
        self.load_dir = self.universal(found)
        section = self.ds_config.setdefault("checkpoint", {})
        assert isinstance(section, dict)
        section["load_universal"] = True
        self.same_world = False
        self._mark("convert")

    def _metrics_writer(self) -> MetricsWriter:
        """metrics.jsonl, TensorBoard, logger='s trackers (rank 0, one run across attempts)."""
        from slurmtrain.compute.observe.metrics import MetricsWriter
        from slurmtrain.compute.observe.trackers import open_trackers, tensorboard_on

        cfg, run, n, rows = self.cfg, self.run, self.attempt.number, self.attempt.rows
        return MetricsWriter(
            run.metrics,
            self.rank == 0,
            n,
            run.tensorboard / f"attempt_{n}" if tensorboard_on(cfg) else None,
            print_lines=self.rank == 0,
            trackers=open_trackers(cfg, run.path, run.metrics, n, rows, self.attempt.record)
            if self.rank == 0
            else None,
            record=self.attempt.record,  # a failing TensorBoard's `tracker_failed` row
        )

    def universal(self, found: Resume) -> Path:
        """`found`'s universal form (collective; converted once, cached), in its own phase."""
        from slurmtrain.compute.checkpoint import reshape

        self.watchdog.phase(CONVERT, self.deadlines.convert_s(listed(found.manifest)))
        beat = self.watchdog.progress(CONVERT, "converting to universal")
        verify = self.cfg.checkpoint.verify
        return reshape.for_world(found, self.rank, self.world, self.attempt.record, verify, beat)

    # ---- resume --------------------------------------------------------------------------------
    def resume(self) -> None:
        """Load the chosen checkpoint (weights, optimizer, scheduler, RNG) on every rank; one
        that fails to load is marked and the previous one tried (recovery.load_resumed)."""
        from slurmtrain.common.resumed import resumed_line
        from slurmtrain.compute import recovery

        if self.found.path is None or self.load_dir is None:
            return
        t0 = time.time()
        if not recovery.load_resumed(self):  # self.stop says why
            return
        self.start_step = int(self.found.manifest["step"])
        self.sampler.skip = recovery.data_skip(self, self.found.manifest)
        self.watchdog.beat("checkpoint load")
        loaded = events.CheckpointLoaded(
            step=self.start_step,
            seconds=time.time() - t0,
            rank_bytes=self.checkpointer.loaded_bytes,  # the measured read rate's bytes
            world_size=self.world,
            path=str(self.load_dir),
            world_size_changed=not self.same_world,
            skipped_samples=self.sampler.skip,
        )
        self.attempt.record(loaded)
        if self.rank == 0:  # every attempt says where it resumed from (common/resumed.py)
            line = resumed_line(
                self.start_step,
                self.found.path,
                self.found.manifest.get("time"),
                universal=not self.same_world,
            )
            print(line, file=sys.stderr, flush=True)

    # ---- loop ----------------------------------------------------------------------------------
    def save(self, step: int, loss: float) -> Optional[str]:
        """A collective save; the checkpointer records saved/failed events and prunes. Returns why
        it refused instead (non-finite loss or parameters: the loop treats it as a divergence)."""
        if not math.isfinite(loss):
            return "non-finite loss at a save"
        from slurmtrain.compute.model import params_finite

        if not params_finite(self.engine.module, self.device):
            return "non-finite parameters at a save"
        self.checkpointer.save(self.engine, step, self.meta(step, loss), rng_state())
        return None

    def meta(self, step: int, loss: Optional[float] = None) -> Meta:
        """The checkpoint's client state at `step` (both tiers)."""
        consumed = step * int(self.cfg.train.global_batch_size or 0)
        return {
            "world_size": self.world,
            "consumed_samples": consumed,
            "zero_stage": self.cfg.deepspeed.stage,
            "tensor_parallel": tensor_parallel(self.cfg),  # AutoTP degree (mp_rank_NN files)
            "loss": loss,
            # blends: samples per source; after rollbacks: the samples skipped past diverged windows
            "data_position": {
                **self.sampler.position(consumed),
                "skipped_samples": self.sampler.skip,
                "epoch": (self.sampler.skip + consumed) // self.sampler.num_samples,
            },
        }

    def on_stop(self, step: int, code: int) -> None:
        """The ranks agreed to stop: recorded now, before the save (which may outlast GraceTime)."""
        if self.signalled or code == signals.REPLACE_NODE:  # rank 0's own stop: no signal
            return
        self.signalled = True
        name = "SIGINT" if self.flags.received == "SIGINT" else "SIGTERM"  # INT: Ctrl-C
        name = "SIGUSR2" if code == signals.TIME_LIMIT else name
        self.attempt.record(
            events.Signal(
                signal=name, step=step, received_at=self.flags.received_at, before_save=True
            )
        )

    def _mark(self, phase: str, **facts: object) -> None:
        """Rank 0 closes a start-up phase (compute/startup.py); a no-op once training runs."""
        clock = self.attempt.clock
        if clock is not None and not clock.done:
            clock.mark(phase, **facts)

    def on_step(self, step: int, seconds: float) -> None:
        clock = self.attempt.clock
        if clock is not None and not clock.done:  # the first step: the start-up's one row
            clock.finish(self.attempt.record)
        io_count.first_step(self.ctx.where)  # SLURMTRAIN_COUNT_IO=1 only
        self.attempt.step = step
        self.watchdog.beat(f"step {step}")
        self.memory.after_step(step)
        self.injector.after_step(step, seconds)
        if self.local is not None and self.local.due(step):  # the node-local tier (issue 38)
            self.local.save(self.engine, step, self.meta(step), rng_state())

    def loop(self) -> Outcome:
        from slurmtrain.compute import loop, parallel
        from slurmtrain.compute.divergence import Guard
        from slurmtrain.compute.evaluate import Evaluator
        from slurmtrain.compute.observe.perf import Perf

        cfg, ctx = self.cfg, self.ctx
        pause = cfg.train.pause_at_step if self.start_step < cfg.train.pause_at_step else None
        f = cfg.faults
        try:
            perf = Perf(self.engine, cfg, ctx, self.run.path)
            if perf.watch is not None:  # a chronic straggler, a spare idle: replaced at once
                perf.watch.replace = self.flags.replace_node
            shard = parallel.data_coords(cfg, self.rank, self.world)  # TP: a group, one batch
            evaluator = Evaluator(self.data, cfg, ctx, self.deadlines.fixed(EVAL), shard=shard)
            hooks = loop.LoopHooks(
                self.save,
                self.flags,
                self.metrics,
                perf,
                on_step=self.on_step,
                on_stop=self.on_stop,
                poison=self.injector.poison,
                evaluator=evaluator,
                guard=Guard(f.spike_factor, f.spike_window, f.max_overflow_steps),
                stop_at=pause,
            )
            while True:
                batches = loop.Batches(
                    self.tokens, self.sampler, grad_accumulation(cfg, self.world)
                )
                state = loop.LoopState(self.start_step, self.start_step, time.time())
                outcome = loop.train(self.engine, cfg, batches, state, ctx, hooks)
                if outcome.diverged is None or not self.rollback(outcome.diverged):
                    return outcome
        except BaseException:
            self.checkpointer.abandon()  # an async save already copied may still publish
            raise
        finally:
            self.memory.stop()
            self.metrics.close()

    def rollback(self, d: Divergence) -> bool:
        """Roll back in this process (recovery.rollback); False (and `self.stop`) to stop."""
        from slurmtrain.compute import recovery

        return recovery.rollback(self, d)

    # ---- outcome -------------------------------------------------------------------------------
    def outcome(self, outcome: Outcome) -> int:
        """Record how the attempt ended; the exit code tells the supervisor what to do next."""
        self.checkpointer.settle()  # async: the last save is published (or failed) on every rank
        if self.stop is not None:  # diverged past its rollbacks: stop, no restart
            return self.stopped()
        final = self.checkpointer.last
        max_steps = int(self.cfg.train.max_steps or 0)
        stopped = outcome.stop_code != signals.NONE
        saved = final is None or final.ok or final.step != outcome.step
        if stopped and outcome.step >= max_steps and saved:
            # A signal in the final step: the stop's save is the final checkpoint, and another
            # job would only load it to record this.
            self.on_stop(outcome.step, outcome.stop_code)
            self.attempt.record(events.Finished(step=outcome.step, on_signal=True))
            return 0
        if not stopped and final is not None and not final.ok and final.step == outcome.step:
            # Training reached its end but its final state is not on disk: not finished.
            not_saved = f"final checkpoint not saved: {final.error}"
            failed = events.Failed(cls=FailureClass.crash, error=not_saved, step=outcome.step)
            self.attempt.record(failed)
            return 1
        if not stopped and outcome.step < max_steps:
            # train.pause_at_step: the next job resumes
            self.attempt.record(events.Paused(step=outcome.step))
            return 0
        if not stopped:
            if self.local is not None:  # the shared tier holds the final state: free the node's
                self.local.drop()
            self.attempt.record(events.Finished(step=outcome.step))
            return 0
        self.on_stop(outcome.step, outcome.stop_code)  # normally recorded before the save
        # The supervisor restarts a time-limited run, and asks Slurm whether a SIGTERM was a
        # preemption (restart) or a scancel (stop).
        return signals.EXIT_CODES[outcome.stop_code]

    # ---- teardown ------------------------------------------------------------------------------
    def teardown(self) -> None:
        """ZeRO-3 aborts at interpreter exit in ~7% of runs unless torn down in this order."""
        self.engine.destroy()
        del self.engine, self.net
        gc.collect()
