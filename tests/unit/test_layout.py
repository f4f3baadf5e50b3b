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


def test_config_yaml_is_omegaconf_text(tmp_path):
    """The fast writer of config.yaml gives exactly OmegaConf's text (tricky strings too)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from slurmtrain.common import schema
    from slurmtrain.common.rundir import config_yaml
    from slurmtrain.login.prepare import resolve

    schema.register()
    overrides = [
        "cluster=slurm",
        f"runs_root={tmp_path}",
        "model=opt13b",
        "nodes=2-4",
        "+cluster.env.A='1e-3'",
        "+cluster.env.B='true'",
        "+cluster.env.C='x: y'",
        "+cluster.env.D='0755'",
        "+cluster.env.E='ünï'",
    ]
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = resolve(compose("config", overrides=overrides))
    assert config_yaml(cfg) == OmegaConf.to_yaml(cfg, resolve=True)
