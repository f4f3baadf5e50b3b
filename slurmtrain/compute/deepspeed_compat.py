"""The run-time changes to DeepSpeed that no public API makes, each written for DEEPSPEED_VERSION.

Everything else slurmtrain does to DeepSpeed goes through its public surface (`custom_load_fn`
for loads, compute/checkpoint/module_states.py; the ZeRO optimizer's `update_lp_params`). What is
here stays only because nothing public does it; each function's docstring says why, and
tests/unit/test_deepspeed_compat.py fails when the installed DeepSpeed is another version or a
patched target's source changed, so a pin bump re-checks every patch here (and whether DeepSpeed
now offers a way that needs none).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    from slurmtrain.common.schema import RootConfig

DEEPSPEED_VERSION = "0.19.8"  # checked against this one; the test compares the installed one

MUON = "deepspeed.runtime.zero.muon"  # its two modules below torch.compile kernels at import


def _never_called(*args: object, **kwargs: object) -> NoReturn:
    raise RuntimeError(
        "DeepSpeed's Muon is stubbed by slurmtrain (deepspeed_compat.py): AdamW only"
    )


def skip_muon_compile() -> None:
    """Stub DeepSpeed's two Muon modules in `sys.modules` (before `deepspeed.initialize`).

    DeepSpeed imports them on AdamW runs too, inside its own functions (`initialize`'s ZeRO
    optimizer check, zero/utils.py; each ZeRO-1/2 step's gradient copy, stage_1_and_2.py), and
    `original_muon` decorates kernels with `torch.compile` at import, which loads dynamo and
    inductor: seconds per rank at every start. No config key or import order avoids those
    function-level imports (TORCHDYNAMO_DISABLE still imports dynamo), so stub modules answer:
    nothing is an instance of the stub class, the stub function raises if ever called. Where
    DeepSpeed has no Muon, or a module was imported already, nothing changes."""
    try:
        if importlib.util.find_spec(MUON) is None:
            return
    except ImportError:  # a DeepSpeed without Muon
        return
    names: dict[str, dict[str, object]] = {
        f"{MUON}.muon_optimizer": {"MuonWithAuxAdam": type("MuonWithAuxAdam", (), {})},
        f"{MUON}.original_muon": {"muon_update": _never_called},
    }
    for name, attrs in names.items():
        if name not in sys.modules:
            stub = types.ModuleType(name, "slurmtrain's stand-in: Muon is never used")
            stub.__dict__.update(attrs)
            sys.modules[name] = stub


@contextlib.contextmanager
def deepspeed_without_mlflow(cfg: RootConfig) -> Iterator[None]:
    """`import deepspeed` inside is told mlflow is absent (`sys.modules["mlflow"] = None`, the
    import system's documented way to make an import raise ImportError); afterwards mlflow imports
    normally again. Unless this run logs to MLflow (logger=mlflow).

    DeepSpeed's package import imports its autotuner (never run here), which imports mlflow when
    installed: most of a second per rank at every start. DeepSpeed has no switch for it, and the
    import happens in `import deepspeed` itself, so no import order avoids it."""
    if getattr(cfg.logger, "mlflow", None) is not None or "mlflow" in sys.modules:
        yield
        return
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
    try:
        yield
    finally:
        if sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]


def no_shm_comm() -> None:
    """Mark DeepSpeed's shared-memory all-reduce op incompatible (CPU ranks, before
    `deepspeed.init_distributed`), so its torch backend uses gloo's.

    The op JIT-compiles for ~50 s on first use. `deepspeed.comm.torch.build_shm_op` builds it
    whenever `deepspeed.ops.__compatible_ops__` says it can, whatever the backend asked for;
    `DS_BUILD_SHM_COMM` only applies when DeepSpeed is installed, and no config key or
    `init_distributed` argument skips the build. The dict is the one `build_shm_op` reads."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def use_checkpoint_engine(engine: DeepSpeedEngine, writer: CheckpointEngine) -> None:
    """Make `writer` the engine's checkpoint engine (after `deepspeed.initialize`).

    DeepSpeed builds its checkpoint engine from the config only (`create_checkpoint_engine`:
    torch, fast, decoupled or datastates); no argument or config key takes a user's
    `CheckpointEngine` subclass, so the engine's (public) attribute is set."""
    engine.checkpoint_engine = writer


def guard_recovery_script(engine: DeepSpeedEngine, log: Callable[[str], None]) -> None:
    """A failed copy of DeepSpeed's recovery scripts (zero_to_fp32.py) into a checkpoint is
    logged, not raised (this engine only).

    `save_checkpoint` copies them on rank 0 between its barriers (`_copy_recovery_script`); an
    OSError there (a full disk) leaves rank 0 alone and the others hang in the next barrier,
    where a disk error must fail the save, never the run (checkpoint/manager.py). No config
    key skips the copy, so this engine's method is wrapped."""
    copy_scripts = engine._copy_recovery_script

    def guarded(path: str) -> None:
        try:
            copy_scripts(path)
        except OSError as err:
            log(f"could not copy DeepSpeed's recovery scripts into {path}: {err}")

    engine._copy_recovery_script = guarded


@contextlib.contextmanager
def each_file_read(
    ce: CheckpointEngine, before: Callable[[str], object], after: Callable[[str], object]
) -> Iterator[None]:
    """Inside, `before(path)` and `after(path)` run around each file the checkpoint engine `ce`
    reads (this instance only; its class's method again afterwards).

    A DeepSpeed load reads every file (model states, optimizer partitions, expert files) through
    `engine.checkpoint_engine.load`, and its `load_checkpoint` takes no per-file callback; the
    engine may be DeepSpeed's own (checkpoint.writer), so the instance's `load` is wrapped."""
    read = ce.load

    def load(path: str, *args: object, **kwargs: object) -> object:
        before(path)
        try:
            return read(path, *args, **kwargs)
        finally:
            after(path)

    ce.load = load
    try:
        yield
    finally:
        del ce.load


def replace_timer_log(timers: object, collect: Callable[..., None]) -> None:
    """`collect` stands in for `log` on this timer group (the engine's `timers`) only.

    With `wall_clock_breakdown` (or the FLOPs profiler) on, the engine and the ZeRO optimizer call
    `timers.log(names)` after every step, which prints a line on rank 0 and resets the timers;
    DeepSpeed has no switch for that print and no hook on its timers (compute/observe/perf.py)."""
    timers.log = collect  # type: ignore[attr-defined]
