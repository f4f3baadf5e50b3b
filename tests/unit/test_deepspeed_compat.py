"""A DeepSpeed pin bump re-checks every patch in compute/deepspeed_compat.py (and the public
DeepSpeed calls module_states.py relies on): these tests fail when the installed DeepSpeed is not
the version the patches were written for, or when a function they rely on changed.

They read DeepSpeed's source files (no `import deepspeed`: milliseconds). On a failure: read the
new DeepSpeed source the message names, check the patch still fits (or is no longer needed: a
public way may exist now), then update DEEPSPEED_VERSION and the hashes below.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import re
from functools import cache
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from slurmtrain.compute import deepspeed_compat
from tests.conftest import ROOT

# target -> sha256 (first 16 hex digits) of its source, as DEEPSPEED_VERSION has it
RELIED_ON = {
    # skip_muon_compile: the optimizer check that imports Muon's modules inside `initialize`
    "deepspeed.runtime.zero.utils:is_zero_supported_optimizer": "4a381236f9c7b805",
    # no_shm_comm: the op is built whenever __compatible_ops__ says it can be
    "deepspeed.comm.torch:build_shm_op": "5ee7daeb8dd5b011",
    "deepspeed.ops:__getattr__": "17551249fc2d1c47",
    # use_checkpoint_engine: the engine comes from the config only
    "deepspeed.runtime.checkpoint_engine.utils:create_checkpoint_engine": "594e76acd19a2088",
    # guard_recovery_script: the copy it wraps
    "deepspeed.runtime.engine:DeepSpeedEngine._copy_recovery_script": "b9bd261b2de226cb",
    # replace_timer_log: the method it stands in for (its signature and what it resets)
    "deepspeed.utils.timer:SynchronizedWallClockTimer.log": "edd99272801b8f17",
    # each_file_read: no per-file callback; module_states.load (public API): custom_load_fn
    # (src=, dst=) replaces the module load, the file's own top-level keys come back as client
    # state (module_states.OMITTED)
    "deepspeed.runtime.engine:DeepSpeedEngine.load_checkpoint": "07078ae3465e44f5",
    "deepspeed.runtime.engine:DeepSpeedEngine._load_checkpoint": "0aac7bfe625e924c",
    "deepspeed.runtime.engine:DeepSpeedEngine.load_module_state_dict": "671a80ef737a81b1",
}


def _file(module: str) -> Path:
    """The installed source file of a DeepSpeed module (found, not imported)."""
    spec = importlib.util.find_spec("deepspeed")  # a top-level spec imports nothing
    assert spec is not None and spec.origin
    path = Path(spec.origin).parent.joinpath(*module.split(".")[1:])
    found = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    assert found.is_file(), f"{module} is gone from DeepSpeed"
    return found


@cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text)


def _source(target: str) -> str:
    """The source of `module:Name` or `module:Class.method`, read from the installed file."""
    module, _, qualname = target.partition(":")
    text, tree = _parsed(_file(module))
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next((n for n in body if getattr(n, "name", None) == part), None)
        assert node is not None, f"{target}: {part} is gone (deepspeed_compat.py relies on it)"
        body = getattr(node, "body", [])
    segment = ast.get_source_segment(text, node)
    assert segment is not None
    return segment


def test_the_installed_deepspeed_is_the_one_the_patches_were_written_for():
    installed = importlib.metadata.version("deepspeed")
    assert installed == deepspeed_compat.DEEPSPEED_VERSION, (
        f"DeepSpeed {installed} is installed; slurmtrain/compute/deepspeed_compat.py was checked "
        f"against {deepspeed_compat.DEEPSPEED_VERSION}: re-check each patch there, then update it"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "deepspeed"]
    assert pin.specifier.contains(deepspeed_compat.DEEPSPEED_VERSION), (
        f"pyproject pins deepspeed{pin.specifier}: re-check deepspeed_compat.py for that version"
    )


def test_what_each_patch_relies_on_is_unchanged():
    changed = []
    for target, expected in RELIED_ON.items():
        digest = hashlib.sha256(_source(target).encode()).hexdigest()[:16]
        if digest != expected:
            changed.append(f"{target}: source hash {digest}, the patch was written for {expected}")
    assert not changed, "DeepSpeed changed what deepspeed_compat.py relies on:\n" + "\n".join(
        changed
    )


def test_the_muon_stubs_hold_every_name_deepspeed_imports_from_them():
    """DeepSpeed's own modules import only names the stubs define (a new one would fail at
    import); and it still imports them: else the stubs are no longer needed."""
    package = _file("deepspeed").parent
    pattern = re.compile(r"from deepspeed\.runtime\.zero\.muon\.(\w+) import (\w+)")
    stubs = {"muon_optimizer": {"MuonWithAuxAdam"}, "original_muon": {"muon_update"}}
    seen: set[tuple[str, str]] = set()
    for path in package.rglob("*.py"):
        if "muon" not in path.parts:
            seen |= set(pattern.findall(path.read_text(errors="replace")))
    assert seen, "DeepSpeed no longer imports its Muon modules: drop skip_muon_compile"
    missing = sorted(f"{m}.{n}" for m, n in seen if n not in stubs.get(m, set()))
    assert not missing, f"DeepSpeed imports names the Muon stubs lack: {missing}"


def test_deepspeed_still_imports_mlflow_at_import():
    """deepspeed_without_mlflow is needed while `import deepspeed` reaches the autotuner's
    `import mlflow` (its config module imports the autotuning package, which imports it)."""
    assert "from .autotuner import" in _file("deepspeed.autotuning").read_text()
    assert "import mlflow" in _file("deepspeed.autotuning.autotuner").read_text()
