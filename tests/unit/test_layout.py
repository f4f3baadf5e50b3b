"""The house: the two worlds stay apart, and the tree stays what the README says it is."""

from __future__ import annotations

import ast
import subprocess
import sys

import tomllib

from tests.conftest import ROOT

PACKAGE = ROOT / "slurmtrain"
LOGIN_SIDE = ("slurmtrain.login", "slurmtrain.batch", "slurmtrain.cli")
HEAVY = ("torch", "deepspeed", "transformers")


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imports(tree: ast.Module) -> set[str]:
    """Every module a file imports, at any depth (function-level imports count too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_login_batch_and_cli_never_import_compute_and_compute_never_imports_them():
    for name, tree in _modules().items():
        imported = _imports(tree)
        if _under(name, LOGIN_SIDE):
            bad = sorted(i for i in imported if _under(i, ("slurmtrain.compute",)))
            assert not bad, f"{name} imports compute modules: {bad}"
        if _under(name, ("slurmtrain.compute",)):
            bad = sorted(i for i in imported if _under(i, LOGIN_SIDE))
            assert not bad, f"{name} imports login-side modules: {bad}"
        if _under(name, ("slurmtrain.common", "slurmtrain.planning")):
            bad = sorted(i for i in imported if _under(i, LOGIN_SIDE + ("slurmtrain.compute",)))
            assert not bad, f"{name} (shared) imports a world's modules: {bad}"


def test_nothing_on_the_login_path_imports_torch_at_import_time():
    names = [
        n
        for n in _modules()
        if not _under(n, ("slurmtrain.compute",)) and not n.endswith("__main__")
    ]
    code = (
        "import sys, importlib\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "import slurmtrain.__main__, hydra_plugins.slurmtrain_launcher.launcher\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"heavy modules imported on the login path: {done.stdout}"


def test_every_module_says_its_one_job_and_stays_readable():
    for name, tree in _modules().items():
        doc = ast.get_docstring(tree)
        assert doc and doc.splitlines()[0].strip(), f"{name}: no docstring saying its job"
        lines = (
            len((ROOT / (name.replace(".", "/") + ".py")).read_text().splitlines())
            if not (ROOT / name.replace(".", "/")).is_dir()
            else 0
        )
        assert lines <= 420, f"{name}: {lines} lines; split it (files stay under ~400 lines)"


def test_top_level_is_the_requested_one_and_the_wheel_lists_every_package():
    for path in ("pyproject.toml", "conf", "sbatch_templates", "slurmtrain", "tests", "tools"):
        assert (ROOT / path).exists(), path
    assert not (PACKAGE / "conf").exists() and not (PACKAGE / "sbatch_templates").exists()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(project["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    on_disk |= {
        "slurmtrain.conf",
        "slurmtrain.sbatch_templates",
        "hydra_plugins",
        "hydra_plugins.slurmtrain_launcher",
    }
    assert listed == on_disk, f"pyproject.toml packages differ from the tree: {listed ^ on_disk}"
    assert project["package-dir"]["slurmtrain.conf"] == "conf"
    assert project["package-dir"]["slurmtrain.sbatch_templates"] == "sbatch_templates"
