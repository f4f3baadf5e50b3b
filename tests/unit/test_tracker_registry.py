"""A tracker is one module (common/tracker_<name>.py): the schema, the login check, rank 0's
openers, `cli sync` and the README's table all come from the registry, and the registry loads on
a login node without any tracker package."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from slurmtrain.common import schema_logger, tracker_registry
from slurmtrain.compute.observe import tracker_backends, trackers
from tests.conftest import ROOT


def test_every_tracker_module_is_in_the_registry_and_everything_derives_from_it():
    names = tracker_registry.names()
    modules = sorted(p.stem for p in (ROOT / "slurmtrain" / "common").glob("tracker_*.py"))
    assert [f"tracker_{n}" for n in names] == [m for m in modules if m != "tracker_registry"]
    assert {"wandb", "mlflow", "aim"} <= set(names)
    fields = [f.name for f in dataclasses.fields(schema_logger.LoggerConfig)]
    assert fields == ["tensorboard", *names]
    assert trackers.TRACKER_KINDS == names and set(tracker_backends.OPENERS) == set(names)
    for t in tracker_registry.trackers():
        assert (ROOT / "conf" / "logger" / f"{t.name}.yaml").is_file(), t.name


def _extras() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def test_each_trackers_extra_is_declared_and_names_its_package():
    extras = _extras()
    for t in tracker_registry.trackers():
        assert t.extra in extras, f"{t.name}: extra {t.extra} not in pyproject.toml"


def test_the_readme_table_is_the_registrys():
    readme = (ROOT / "README.md").read_text()
    table = tracker_registry.readme_table()
    assert table in readme, (
        "README's tracker table differs from the registry; paste the output of\n"
        "python -c 'from slurmtrain.common import tracker_registry as r; print(r.readme_table())'"
        f"\n{table}"
    )


def test_the_registry_loads_without_importing_any_tracker_package():
    packages = [t.package for t in tracker_registry.trackers()]
    code = (
        "import sys\n"
        "from slurmtrain.common import schema, tracker_registry, validation_login\n"
        "import slurmtrain.cli.sync\n"
        "tracker_registry.trackers()\n"
        f"print(sorted(p for p in {packages!r} if p in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(ROOT)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_sync_offers_every_tracker_and_its_flags(capsys):
    from slurmtrain.cli import sync

    try:
        sync.main(["--help"])
    except SystemExit:
        pass
    text = capsys.readouterr().out
    assert "{" + ",".join(tracker_registry.names()) + "}" in text and "--mlflow-uri" in text
