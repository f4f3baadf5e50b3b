"""The collective save/load around a DeepSpeed engine: sync or async, never fatal on disk errors.

A disk error on any rank fails that save only: the ranks agree, rank 0 removes the `.tmp` directory
and records `checkpoint_failed`; earlier checkpoints and `latest` are untouched and the next save
retries (or every rank raises SaveFailed with `checkpoint.on_save_error=stop`).
With `async_save` the loop blocks only while the state is copied to host memory; a background thread
per rank writes it and appends its report to its host's marker (checkpoint/markers.py); rank 0's
thread publishes once every rank's line is there. Background threads run no collectives (gloo is
not thread-safe); outcomes are agreed on the main thread at the next save.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Optional, Union, cast

from slurmtrain.common import events
from slurmtrain.common.checkpoint_format import (
    LATEST,
    Manifest,
    dir_bytes,
    prune,
    publish,
    read_bytes,
    read_manifest,
    tag,
)
from slurmtrain.common.schema import CheckpointConfig
from slurmtrain.compute.checkpoint import markers, module_states
from slurmtrain.compute.checkpoint.beats import Beats, Hook
from slurmtrain.compute.checkpoint.markers import RankReport
from slurmtrain.compute.checkpoint.rng import RngState
from slurmtrain.compute.context import RankContext, Record
from slurmtrain.planning.deadlines import SAVE, Moved

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from slurmtrain.compute.checkpoint.writer import ShardWriter

Meta = dict[str, object]  # the checkpoint's client state: world size, consumed samples, loss, ...


@dataclass
class SaveOutcome:
    step: int
    ok: bool
    error: Optional[str] = None


class SaveFailed(RuntimeError):
    """A save failed and `checkpoint.on_save_error=stop`: every rank raises it at the same step."""


@dataclass
class _Save:
    step: int
    meta: Meta
    started: float
    waited: float
    blocked: float = 0.0


def _log(line: str) -> None:
    print(f"slurmtrain: {line}", file=sys.stderr, flush=True)


class Checkpointer:
    """Collective save/load around a DeepSpeed engine; every rank calls every public method."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        ctx: RankContext,
        root: Path,
        hook: Optional[Hook] = None,
        planned_bytes: Union[int, Moved] = 0,
        protect: Collection[int] = (),
    ) -> None:
        """Saves and loads run in their own watchdog phase (`ctx.deadlines`), with a deadline
        scaled from the bytes: `planned_bytes` (a rank's bytes, or the plan's `Moved`) until a
        save measured them. `hook`: called after each shard written (fault injection).
        `protect`: steps never pruned (rollback targets; the Trainer adds each new one)."""
        self.root, self.rank, self.world, self.verify = root, ctx.rank, ctx.world, cfg.verify
        self.device = ctx.device  # the save thread's too: a new thread's current CUDA device is 0
        self.beats = Beats(ctx.watchdog, ctx.deadlines)
        self.save_bytes: Union[int, Moved] = planned_bytes
        self.loaded_bytes = 0
        self.protect: set[int] = set(protect)
        self.async_save = bool(cfg.async_save)
        self.keep_last, self.keep_every = cfg.keep_last, cfg.keep_every
        self.stop_on_error = cfg.on_save_error == "stop"
        self.hook, self.timeout_s = hook, cfg.publish_timeout_minutes * 60
        self.record: Record = ctx.record
        self.writer: Optional[ShardWriter] = None
        self.last: Optional[SaveOutcome] = None  # the newest outcome every rank agreed on
        self._thread: Optional[threading.Thread] = None
        self._outcome: Optional[SaveOutcome] = None  # rank 0: result of the in-flight save
        self.leads: Optional[list[int]] = None  # every rank's host's lowest rank (async markers)
        root.mkdir(parents=True, exist_ok=True)

    def attach(self, engine: DeepSpeedEngine) -> None:
        """Route DeepSpeed's shard writes through a ShardWriter (when it uses plain torch.save)."""
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
            TorchCheckpointEngine,
        )

        from slurmtrain.compute import deepspeed_compat
        from slurmtrain.compute.checkpoint.writer import ShardWriter

        current = engine.checkpoint_engine
        if type(current) is TorchCheckpointEngine:
            self.writer = ShardWriter(
                current.zipfile_serialization,
                self.verify,
                self.beats.hook(self.hook),
                **self.beats.writer_kwargs(ShardWriter),
            )
            deepspeed_compat.use_checkpoint_engine(engine, self.writer)
        else:
            if self.rank == 0:
                _log(
                    f"checkpoint writer {type(current).__name__} is DeepSpeed's own: saves are "
                    f"synchronous and a disk error ends the run"
                )
            self.async_save = False
        deepspeed_compat.guard_recovery_script(engine, _log)  # zero_to_fp32.py: a convenience

    def save(self, engine: DeepSpeedEngine, step: int, meta: Meta, rng: RngState) -> None:
        """Save `step`; returns when it is published (sync) or copied to host memory (async).
        Refuses a state whose loss is not finite: nothing non-finite is ever published."""
        import math

        loss = meta.get("loss")
        if isinstance(loss, (int, float)) and not math.isfinite(float(loss)):
            raise ValueError(f"refusing to save {tag(step)}: its loss is {loss}")
        with self.beats.phase(SAVE, lambda d: d.save_s(self.save_bytes)):
            self._save(engine, step, meta, rng)

    def _save(self, engine: DeepSpeedEngine, step: int, meta: Meta, rng: RngState) -> None:
        import torch
        import torch.distributed as dist

        started = time.time()
        self.settle()
        job = _Save(step, meta, started, waited=time.time() - started)
        tmp = self.root / f"{tag(step)}.tmp"
        if self.rank == 0:  # leftovers of an attempt killed while saving this same step
            shutil.rmtree(tmp, ignore_errors=True)
            for stale in self.root.glob(f".{tmp.name}.failed_rank*"):
                stale.unlink(missing_ok=True)
        dist.barrier()
        deferred = self.async_save
        if deferred and self.leads is None:  # once: which host marker each rank appends to
            from slurmtrain.compute.distributed import host_leads

            self.leads = host_leads()
        rng_path = str(tmp / f"rng_rank{self.rank}.pt")
        if self.writer is not None:
            self.writer.begin(step, str(tmp), deferred)
        engine.save_checkpoint(
            str(self.root), tag=tmp.name, client_state={"meta": meta}, save_latest=False
        )
        if self.writer is not None:
            self.writer.save(rng, rng_path)
            self.writer.host_copy_done()
        else:
            torch.save(rng, rng_path)
        if deferred:
            job.blocked = time.time() - started
            self._thread = threading.Thread(
                target=self._background, args=(job,), name=f"checkpoint-{tag(step)}", daemon=True
            )
            self._thread.start()
            return
        reports = [markers.failed_here(r, "not gathered") for r in range(self.world)]
        dist.all_gather_object(reports, self._report())
        self._measured(reports)
        outcome = self._conclude(job, reports) if self.rank == 0 else None
        self._agree(outcome)

    def _measured(self, reports: list[RankReport]) -> None:
        """The next save's deadline counts the bytes the busiest rank wrote in this one."""
        written = max(_rank_bytes(r) for r in reports)
        if written:
            self.save_bytes = written

    def settle(self) -> Optional[SaveOutcome]:
        """Wait for the in-flight async save; every rank learns its outcome (collective)."""
        if self._thread is None:
            return None
        with self.beats.phase(SAVE, lambda d: d.save_s(self.save_bytes)):
            self._thread.join()
        self._thread = None
        outcome, self._outcome = self._outcome, None
        return self._agree(outcome)

    def abandon(self, timeout_s: float = 60.0) -> None:
        """On an exception: give the in-flight async save a chance to publish; no collectives."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def load(
        self,
        engine: DeepSpeedEngine,
        directory: Path,
        restore_rng: bool = True,
        manifest: Optional[Manifest] = None,
    ) -> Optional[RngState]:
        """Load a checkpoint (or its universal conversion); the per-rank RNG state when asked.
        `manifest`: the directory's, as rank 0 read and broadcast it (else read here)."""
        try:
            manifest = read_manifest(directory) if manifest is None else manifest
            self.loaded_bytes = read_bytes(manifest["files"], self.rank, self.world)
        except (OSError, ValueError, KeyError):
            planned = self.save_bytes
            self.loaded_bytes = int(planned.rank if isinstance(planned, Moved) else planned)
        name = self.beats.load_phase()
        with self.beats.phase(name, lambda d: d.read_s(self.loaded_bytes)):
            with self.beats.loading(engine, name):
                path = module_states.load(engine, str(directory.parent), directory.name)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {directory}")
        _follow_schedule(engine)
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if restore_rng and rng_file.exists():
            from slurmtrain.compute.checkpoint import safe_load

            state = safe_load.load(rng_file)  # weights only: runs no code
            if not isinstance(state, dict):
                raise ValueError(f"{rng_file} holds no RNG state")
            return cast(RngState, state)  # the dict rng.rng_state() made
        return None

    # -- internals ------------------------------------------------------------------------------

    def _report(self) -> RankReport:
        if self.writer is None:
            return {"rank": self.rank, "ok": True, "error": None, "files": {}}
        return self.writer.report(self.rank)

    def _agree(self, outcome: Optional[SaveOutcome]) -> SaveOutcome:
        import torch.distributed as dist

        box = [outcome]
        dist.broadcast_object_list(box, src=0)
        agreed = box[0]
        assert agreed is not None
        self.last = agreed
        if not agreed.ok and self.stop_on_error:
            raise SaveFailed(
                f"checkpoint {tag(agreed.step)} not saved "
                f"(checkpoint.on_save_error=stop): {agreed.error}"
            )
        return agreed

    def _background(self, job: _Save) -> None:
        assert self.writer is not None  # async saves need slurmtrain's writer (attach)
        try:
            if str(self.device).startswith("cuda"):
                import torch

                torch.cuda.set_device(self.device)  # else GPU 0 gets a context from every rank
            self.writer.flush()
            report = self.writer.report(self.rank)
        except Exception as err:  # noqa: BLE001  whatever happens, rank 0 must hear of it
            report = markers.failed_here(self.rank, f"{type(err).__name__}: {err}")
        tmp = self.root / f"{tag(job.step)}.tmp"
        if self.rank != 0:
            if not report["ok"]:
                self.writer.discard()  # room for the marker that says why, on a full disk
            markers.write(tmp, report, self.leads[self.rank] if self.leads else None)
            return
        try:
            reports = [report, *self._collect(tmp)]
            self._measured(reports)
            self._outcome = self._conclude(job, reports)
        except Exception as err:  # noqa: BLE001
            self._outcome = SaveOutcome(job.step, False, f"{type(err).__name__}: {err}")

    def _collect(self, tmp: Path) -> list[RankReport]:
        """Rank 0's thread: every other rank's report, or a failure when one never comes."""
        leads = self.leads or list(range(self.world))  # not gathered: a marker per rank
        return markers.collect(tmp, leads, self.timeout_s)

    def _conclude(self, job: _Save, reports: list[RankReport]) -> SaveOutcome:
        """Rank 0: publish when every rank wrote its files, else clean up and say why."""
        tmp = self.root / f"{tag(job.step)}.tmp"
        failed = [r for r in reports if not r["ok"]]
        final: Optional[Path] = None
        if not failed:
            try:
                final = publish(self.root, job.step, job.meta, self.verify, reports)
            except OSError as err:
                failed = [markers.failed_here(0, f"publishing: {type(err).__name__}: {err}")]
        if failed or final is None:
            shutil.rmtree(tmp, ignore_errors=True)
            error = "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed[:4])
            if len(failed) > 4:
                error += f"; and {len(failed) - 4} more ranks"
            latest = self.root / LATEST
            pointed = latest.read_text().strip() if latest.exists() else "none"
            self.record(events.CheckpointFailed(step=job.step, error=error, path=str(tmp)))
            then = (
                "stopping (checkpoint.on_save_error=stop)"
                if self.stop_on_error
                else "training goes on; the next save retries"
            )
            _log(
                f"checkpoint {tag(job.step)} NOT saved: {error}. Earlier checkpoints are intact "
                f"(latest: {pointed}); {then}"
            )
            return SaveOutcome(job.step, False, error)
        total = time.time() - job.started
        saved = events.CheckpointSaved(
            step=job.step,
            seconds=job.blocked if self.async_save else total,
            total_seconds=total,
            wait_seconds=job.waited,
            bytes=dir_bytes(final),
            path=str(final),
            mode="async" if self.async_save else "sync",
            world_size=self.world,
            rank_bytes=max(_rank_bytes(r) for r in reports),  # the measured write rate's bytes
            write_seconds={**_slowest(reports)},
            data_position=_position(job.meta),  # blends: samples drawn per source
        )
        self.record(saved)
        prune(self.root, self.keep_last, self.keep_every, self.protect)
        return SaveOutcome(job.step, True)


def _follow_schedule(engine: DeepSpeedEngine) -> None:
    """The optimizer groups' lr from this config's schedule: DeepSpeed restores the saved groups
    (the parent's lr, after a branch changed optim.lr) after the scheduler (ds_config.py)."""
    follow = getattr(engine.lr_scheduler, "follow_config", None)
    if follow is not None:
        follow()


def _rank_bytes(report: RankReport) -> int:
    files = report.get("files")
    if not isinstance(files, dict):
        return 0
    return sum(int(f.get("size", 0)) for f in files.values() if isinstance(f, dict))


def _position(meta: Meta) -> Optional[dict[str, object]]:
    """The save's data position (a dict in `meta`), as the `CheckpointSaved` row holds it."""
    position = meta.get("data_position")
    return {str(k): v for k, v in position.items()} if isinstance(position, dict) else None


def _slowest(reports: list[RankReport]) -> dict[str, float]:
    """The slowest rank's serialize/hash/fsync seconds: where a save's time went."""
    parts = [s if isinstance(s := r.get("seconds"), dict) else {} for r in reports]
    keys = dict.fromkeys(["serialize", "hash", "fsync", *(k for p in parts for k in p)])
    return {key: max(float(p.get(key, 0.0)) for p in parts) for key in keys}


_write_marker, _read_marker = markers.write, markers.read  # the names tests and tools know
