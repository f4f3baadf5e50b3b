"""pyproject.toml declares every third-party package the shipped code imports, and nothing stale.

An import at module level (outside try/except ImportError) must be a core dependency: the package
fails to import without it. One made lazily (inside a function) or guarded by `except ImportError`
may instead come from an extra (`pip install slurmtrain[wandb]`). Modules map to distributions
through importlib.metadata.packages_distributions(); a module of an extra that is not installed here
maps to its own name (wandb -> wandb).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import tomllib

from tests.conftest import ROOT

SHIPPED = ("slurmtrain", "hydra_plugins")  # the packages a wheel installs
FIRST_PARTY = {"slurmtrain", "hydra_plugins", "tests"}
# Declared although no shipped module imports them by name; each says who needs it.
DECLARED_FOR_OTHERS = {
    "accelerate": "transformers' DeepSpeed integration (ZeRO-3 from_pretrained) imports it",
    "psutil": "bench/ measures processes with it (and DeepSpeed needs it)",
}


def _normal(name: str) -> str:
    """PEP 503 normal form: Jinja2 / jinja_2 / PyYAML compare as jinja2 / pyyaml."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(spec: str) -> str:
    return _normal(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec).group(1))


def _declared() -> tuple[set[str], set[str]]:
    """(core dependencies, everything in any extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(s) for s in project.get("dependencies", [])}
    extras = {
        _requirement_name(s)
        for specs in project.get("optional-dependencies", {}).values()
        for s in specs
        if not s.strip().startswith("slurmtrain")  # an extra naming another: slurmtrain[x]
    }
    return core, extras


class _Imports(ast.NodeVisitor):
    """Top-level module names imported by one file: `required` at module level and unguarded,
    `optional` inside a function, under `except ImportError`, or under `if TYPE_CHECKING`."""

    def __init__(self) -> None:
        self.required: set[str] = set()
        self.optional: set[str] = set()
        self._lazy = 0

    def _add(self, module: str) -> None:
        (self.optional if self._lazy else self.required).add(module.split(".")[0])

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module)

    def _lazily(self, node: ast.AST) -> None:
        self._lazy += 1
        self.visit(node)
        self._lazy -= 1

    def _body_lazily(self, node: ast.AST) -> None:
        self._lazy += 1
        self.generic_visit(node)
        self._lazy -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _body_lazily

    def visit_Try(self, node: ast.Try) -> None:
        guarded = any(_catches_import_error(h.type) for h in node.handlers)
        for stmt in node.body:
            (self._lazily if guarded else self.visit)(stmt)
        for stmt in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(stmt)

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for stmt in node.body:
                self._lazily(stmt)
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)


def _catches_import_error(handler_type: ast.expr | None) -> bool:
    if handler_type is None:
        return True  # a bare except catches it too
    names = {n.id for n in ast.walk(handler_type) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(handler_type) if isinstance(n, ast.Attribute)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _third_party(modules: set[str]) -> set[str]:
    return {m for m in modules if m not in sys.stdlib_module_names and m not in FIRST_PARTY}


def scan(roots: list[Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({module: files importing it unguarded at module level}, {module: files importing it
    lazily or guarded}) over every .py file under roots."""
    required: dict[str, set[str]] = {}
    optional: dict[str, set[str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            found = _Imports()
            found.visit(ast.parse(path.read_text(), str(path)))
            where = str(path.relative_to(ROOT))
            for module in _third_party(found.required):
                required.setdefault(module, set()).add(where)
            for module in _third_party(found.optional):
                optional.setdefault(module, set()).add(where)
    return required, optional


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    """The distributions that provide a top-level module (its own name when none is installed)."""
    found = _installed().get(module) or [module]
    return {_normal(d) for d in found}


def test_every_imported_package_is_declared_and_module_level_ones_are_core():
    core, extras = _declared()
    required, optional = scan([ROOT / p for p in SHIPPED])
    problems = []
    for module, files in sorted(required.items()):
        if not distributions(module) & core:
            problems.append(
                f"{module} ({sorted(distributions(module))[0]}) is imported at module level by "
                f"{sorted(files)[0]} but is not in pyproject.toml's dependencies"
            )
    for module, files in sorted(optional.items()):
        if module not in required and not distributions(module) & (core | extras):
            problems.append(
                f"{module} ({sorted(distributions(module))[0]}) is imported by {sorted(files)[0]} "
                f"but is in neither pyproject.toml's dependencies nor an extra"
            )
    assert not problems, "\n".join(problems)


def test_every_core_dependency_is_imported_or_says_who_needs_it():
    core, _ = _declared()
    required, optional = scan([ROOT / p for p in (*SHIPPED, "tools", "bench")])
    used = set().union(*(distributions(m) for m in {*required, *optional}))
    stale = sorted(core - used - set(DECLARED_FOR_OTHERS))
    assert not stale, f"declared in pyproject.toml but imported nowhere: {stale}"


def test_the_scan_tells_module_level_from_lazy_and_guarded_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        "import numpy as np\n"
        "from typing import TYPE_CHECKING\n"
        "try:\n    import wandb\nexcept ImportError:\n    wandb = None\n"
        "if TYPE_CHECKING:\n    import mlflow\n"
        "def f():\n    from huggingface_hub import x\n    import os\n"
    )
    found = _Imports()
    found.visit(ast.parse((tmp_path / "pkg" / "mod.py").read_text()))
    assert _third_party(found.required) == {"numpy"}
    assert _third_party(found.optional) == {"wandb", "mlflow", "huggingface_hub"}
