"""Python, packaging tools and virtual environment: the layer every later failure hides behind.

Known-bad combinations are reported only where the breakage is documented upstream:
- setuptools 70.0 dropped `pkg_resources.packaging`; torch < 2.2's cpp_extension imports it
  (pypa/setuptools#4385), so DeepSpeed's JIT op builds fail there.
- setuptools 82.0 removed `pkg_resources`; torch < 2.9's cpp_extension still imports it.
- torch's cpp_extension imports setuptools, so JIT-built DeepSpeed ops need it installed.
- PEP 660 editable installs (`pip install -e .` of a pyproject-only package) need pip >= 21.3
  and setuptools >= 64.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from importlib import metadata
from typing import Optional

from .results import CheckResult

MIN_PYTHON = (3, 10)  # torch 2.13 declares Requires-Python >= 3.10


def version_tuple(text: Optional[str]) -> tuple[int, ...]:
    """Leading numeric release of a version string: '2.13.0+cpu' -> (2, 13, 0); '' -> ()."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def dist_version(name: str) -> Optional[str]:
    """Installed version of a distribution without importing it; None when absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_python() -> CheckResult:
    ver = sys.version_info
    value = f"{sys.implementation.name} {ver.major}.{ver.minor}.{ver.micro} ({sys.executable})"
    if ver[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return CheckResult(
            "python",
            "fail",
            value,
            f"torch and slurmtrain need Python >= {need}; "
            f"create the venv with a newer interpreter (module load python / uv python)",
        )
    return CheckResult("python", "ok", value)


def packaging_problems(
    pip: Optional[str], setuptools: Optional[str], torch: Optional[str]
) -> list[str]:
    """Documented-bad combinations among the given versions (pure: tests feed it versions)."""
    problems = []
    st, tv, pv = version_tuple(setuptools), version_tuple(torch), version_tuple(pip)
    if torch and not setuptools:
        problems.append(
            "setuptools missing: torch.utils.cpp_extension imports it, so DeepSpeed JIT op "
            "builds fail; install setuptools into the venv"
        )
    if st and tv and st >= (70,) and tv < (2, 2):
        problems.append(
            f"setuptools {setuptools} with torch {torch}: torch < 2.2 imports "
            "pkg_resources.packaging (removed in setuptools 70); use setuptools<70 in this venv"
        )
    elif st and tv and st >= (82,) and tv < (2, 9):
        problems.append(
            f"setuptools {setuptools} with torch {torch}: pkg_resources was removed in "
            "setuptools 82 and torch < 2.9 cpp_extension imports it; use setuptools<82"
        )
    if pv and pv < (21, 3):
        problems.append(f"pip {pip} < 21.3 cannot do PEP 660 editable installs (pip install -e .)")
    if st and st < (64,):
        problems.append(f"setuptools {setuptools} < 64 cannot do PEP 660 editable installs")
    return problems


def check_packaging() -> CheckResult:
    pip, st, torch = dist_version("pip"), dist_version("setuptools"), dist_version("torch")
    venv_tool = dist_version("virtualenv")
    has_venv = importlib.util.find_spec("venv") is not None
    has_ensurepip = importlib.util.find_spec("ensurepip") is not None
    has_pkg_resources = importlib.util.find_spec("pkg_resources") is not None
    parts = [
        f"pip {pip or 'missing'}",
        f"setuptools {st or 'missing'}",
        f"wheel {dist_version('wheel') or '-'}",
        f"virtualenv {venv_tool or '-'}",
        "venv "
        + ("yes" if has_venv and has_ensurepip else "no ensurepip" if has_venv else "missing"),
        "pkg_resources " + ("yes" if has_pkg_resources else "no"),
    ]
    value = ", ".join(parts)
    problems = packaging_problems(pip, st, torch)
    if not pip:
        problems.insert(
            0, "pip missing from this interpreter: python -m ensurepip, or recreate the venv"
        )
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return CheckResult("packaging", "warn", value, problems[0] + more)
    return CheckResult("packaging", "ok", value)


def check_venv() -> CheckResult:
    prefix, base = sys.prefix, getattr(sys, "base_prefix", sys.prefix)
    active = os.environ.get("VIRTUAL_ENV")
    conda = os.environ.get("CONDA_PREFIX")
    if prefix != base:
        if active and os.path.realpath(active) != os.path.realpath(prefix):
            return CheckResult(
                "venv",
                "warn",
                f"running {prefix}, but VIRTUAL_ENV={active}",
                "the activated venv is not the one running: call its bin/python explicitly",
            )
        return CheckResult("venv", "ok", f"venv {prefix}")
    if conda and os.path.realpath(conda) == os.path.realpath(prefix):
        return CheckResult("venv", "ok", f"conda env {prefix}")
    return CheckResult(
        "venv",
        "warn",
        f"system interpreter {prefix}",
        "not in a virtual environment: python -m venv .venv && .venv/bin/pip install -e . "
        "(keeps compute nodes on the same versions)",
    )


def python_checks() -> list[CheckResult]:
    return [check_python(), check_packaging(), check_venv()]
