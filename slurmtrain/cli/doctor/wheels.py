"""GLIBC of this machine against the newest manylinux tag an installed wheel was built for.

A wheel tagged manylinux_2_X only loads where glibc >= 2.X. pip on a newer login node happily
installs wheels that then fail on older compute nodes with "GLIBC_2.X not found"; the fix is an
older wheel or a container, never upgrading the system C library.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Iterable, Optional, Sequence

from .results import CheckResult

Glibc = tuple[int, int]
LEGACY_ALIASES: dict[str, Glibc] = {
    "manylinux1": (2, 5),
    "manylinux2010": (2, 12),
    "manylinux2014": (2, 17),
}
_PEP600 = re.compile(r"^manylinux_(\d+)_(\d+)_\w+$")
_LEGACY = re.compile(r"^(manylinux1|manylinux2010|manylinux2014)_\w+$")


def manylinux_glibc(platform_tag: str) -> Optional[Glibc]:
    """glibc a manylinux platform tag needs: 'manylinux_2_28_x86_64' -> (2, 28), 'manylinux2014_x86_64'
    -> (2, 17); None for tags that do not constrain glibc (any, linux_x86_64, musllinux_*, macOS...)."""
    tag = platform_tag.strip().lower()
    match = _PEP600.match(tag)
    if match:
        return int(match.group(1)), int(match.group(2))
    match = _LEGACY.match(tag)
    return LEGACY_ALIASES[match.group(1)] if match else None


def wheel_tags(wheel_text: str) -> list[str]:
    """The 'Tag:' values of a WHEEL metadata file, e.g. ['cp311-cp311-manylinux_2_28_x86_64']."""
    return [
        line.split(":", 1)[1].strip()
        for line in wheel_text.splitlines()
        if line.lower().startswith("tag:") and line.split(":", 1)[1].strip()
    ]


def required_glibc(tags: Iterable[str]) -> Optional[Glibc]:
    """Oldest glibc on which some tag of this wheel installs (pip needs only one tag to match).

    None when any tag is not glibc-bound ('any', a locally built 'linux_x86_64'): it loads anywhere
    it could be installed. Compressed platform sets ('a.b') count as separate tags.
    """
    needs: list[Glibc] = []
    for tag in tags:
        for plat in tag.rsplit("-", 1)[-1].split("."):
            need = manylinux_glibc(plat)
            if need is None:
                return None
            needs.append(need)
    return min(needs) if needs else None


def machine_glibc() -> Optional[Glibc]:
    """This machine's glibc, e.g. (2, 36); None on musl or when it cannot be told."""
    text = ""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""  # 'glibc 2.36'
    except (ValueError, OSError, AttributeError):
        pass
    if not text.startswith("glibc"):
        lib, ver = platform.libc_ver()
        text = f"{lib} {ver}" if lib == "glibc" else ""
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class WheelNeed:
    name: str
    version: str
    glibc: Glibc

    def label(self) -> str:
        return f"{self.name} {self.version}"


def installed_wheel_needs(paths: Optional[Sequence[str]] = None) -> list[WheelNeed]:
    """glibc needs of every installed distribution on `paths` (default sys.path); first copy of a name wins,
    as for imports."""
    seen: set[str] = set()
    needs: list[WheelNeed] = []
    for dist in metadata.distributions(path=list(paths) if paths is not None else sys.path):
        name = (dist.metadata["Name"] or "").strip()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if not key or key in seen:
            continue
        seen.add(key)
        try:
            text = dist.read_text("WHEEL")
        except OSError:
            text = None
        need = required_glibc(wheel_tags(text)) if text else None
        if need:
            needs.append(WheelNeed(name, dist.version or "?", need))
    return needs


def _fmt(v: Glibc) -> str:
    return f"{v[0]}.{v[1]}"


def _names(needs: list[WheelNeed], limit: int = 4) -> str:
    shown = ", ".join(n.label() for n in needs[:limit])
    return shown + (f" +{len(needs) - limit} more" if len(needs) > limit else "")


def evaluate_glibc(machine: Optional[Glibc], needs: list[WheelNeed]) -> CheckResult:
    """The verdict, from facts already gathered (pure)."""
    if not needs:
        have = f"glibc {_fmt(machine)}" if machine else "glibc unknown"
        return CheckResult("glibc", "ok", f"{have}; no installed wheel is manylinux-tagged")
    newest = max(n.glibc for n in needs)
    top = [n for n in needs if n.glibc == newest]
    if machine is None:
        return CheckResult(
            "glibc",
            "warn",
            f"not glibc (musl?); {_names(top)} need glibc {_fmt(newest)}",
            "manylinux wheels need glibc: use musllinux wheels or a glibc container",
        )
    too_new = sorted(
        (n for n in needs if n.glibc > machine), key=lambda n: (n.glibc, n.name), reverse=True
    )
    if too_new:
        detail = "; ".join(f"{n.label()} needs {_fmt(n.glibc)}" for n in too_new[:4])
        more = f" (+{len(too_new) - 4} more)" if len(too_new) > 4 else ""
        names = ", ".join(sorted({n.name for n in too_new}))
        return CheckResult(
            "glibc",
            "fail",
            f"glibc {_fmt(machine)}; {detail}{more}",
            f"do not upgrade GLIBC; install an older wheel of {names} "
            f"(manylinux_{machine[0]}_{machine[1]} or older) or use a container",
        )
    return CheckResult(
        "glibc",
        "ok",
        f"glibc {_fmt(machine)}; newest need {_fmt(newest)} ({_names(top)})",
        "" if newest < machine else "compute nodes need glibc >= this too (--srun checks them)",
    )


def check_glibc(paths: Optional[Sequence[str]] = None) -> CheckResult:
    return evaluate_glibc(machine_glibc(), installed_wheel_needs(paths))
