"""How far `cfg` travels in one login check: the package functions `prepare.check` calls with the
config (or a section of it) as an argument, the files they live in, and the climbs back up a layer.

Issue 34 measured 83 stops in 29 files with 15 climbs (29 in 15 files two waves before). A stop is
a distinct package function entered with a config object among its arguments; a climb is such a
call whose callee sits in a higher layer than its caller (login > planning > common), the walk
bouncing back up. Run it on two checkouts to compare:

    python bench/login_walk.py                      # this checkout
    PYTHONPATH=/path/to/old python bench/login_walk.py
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from types import FrameType
from typing import Optional

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from slurmtrain.common import schema
from slurmtrain.login import prepare

LAYERS = {"login": 2, "planning": 1, "common": 0}


def _layer(filename: str) -> Optional[int]:
    parts = filename.replace(os.sep, "/").split("/slurmtrain/")
    if len(parts) < 2:
        return None
    return LAYERS.get(parts[-1].split("/")[0])


def _carries_config(frame: FrameType) -> bool:
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if isinstance(value, DictConfig) or (
            dataclasses.is_dataclass(value)
            and type(value).__module__.startswith("slurmtrain.common.schema")
        ):
            return True
    return False


def walk(overrides: list[str]) -> tuple[set[tuple[str, str]], int, int, int]:
    """(stops, climbs, calls, returns to a file left before) of one check of the config
    `overrides` compose."""
    root = tempfile.mkdtemp(prefix="login_walk.")
    schema.register()
    # the checkout's own conf/ (an editable install maps slurmtrain.conf to the installed tree)
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(schema.__file__))), "..")
    conf = os.path.normpath(os.path.join(conf, "conf"))
    with initialize_config_dir(
        config_dir=conf if os.path.isdir(conf) else schema.conf_dir(), version_base="1.3"
    ):
        cfg = compose("config", overrides=[f"runs_root={root}", "dry_run=true", *overrides])
    cfg = prepare.resolve(cfg)
    stops: set[tuple[str, str]] = set()
    climbs = calls = returns = 0
    trail: list[str] = []  # files in the order the walk entered them

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal climbs, calls, returns
        if event != "call":
            return
        here = _layer(frame.f_code.co_filename)
        if here is None or not _carries_config(frame):
            return
        where = frame.f_code.co_filename.split("/slurmtrain/")[-1]
        stops.add((where, frame.f_code.co_name))
        calls += 1
        if trail and trail[-1] != where and where in trail:
            returns += 1
        trail.append(where)
        caller = frame.f_back
        below = _layer(caller.f_code.co_filename) if caller is not None else None
        if below is not None and here > below:
            climbs += 1

    sys.setprofile(profile)
    try:
        prepare.check(cfg, quiet=True)
    finally:
        sys.setprofile(None)
    return stops, climbs, calls, returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", default=["model=opt125m"])
    parser.add_argument("--list", action="store_true", help="print every stop")
    args = parser.parse_args()
    stops, climbs, calls, returns = walk(args.overrides)
    files = {f for f, _ in stops}
    print(
        f"login walk of {' '.join(args.overrides)}: {len(stops)} stops in {len(files)} files, "
        f"{calls} calls, {returns} returns to a file left before, {climbs} climbs back up a "
        f"layer  ({prepare.__file__})"
    )
    if args.list:
        for f, name in sorted(stops):
            print(f"  {f}:{name}")


if __name__ == "__main__":
    main()
