"""`slurmtrain [KEY=VALUE ...]` (or `python -m slurmtrain`): compose -> validate -> plan -> run
directory -> submit. `slurmtrain COMMAND ...` (status, logs, report, doctor, ...) and `slurmtrain
--help` go to slurmtrain/cli/__main__.py before Hydra reads argv.

Login-node code: nothing imported here pulls in torch, deepspeed or transformers, so a dry run takes
under half a second (bench/dry_run_speed.py). Every user mistake ends as one line (key, value, fix)
and exit code 2.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from slurmtrain.common import schema
from slurmtrain.common.errors import EXIT_CONFIG, ConfigError
from slurmtrain.common.hydra_errors import one_line
from slurmtrain.common.secrets import redact_text
from slurmtrain.login.launch import launch_one
from slurmtrain.login.placement import with_why

schema.register()


def _overrides() -> list[str]:
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # composed outside Hydra's main (tests)
        return []


def _refuse(line: str) -> NoReturn:
    """Exit here with the one line (Hydra would print its own banner first); when cluster=auto
    chose this machine, the line says why and how to force Slurm."""
    print(f"slurmtrain: error: {redact_text(with_why(line))}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG) from None


@hydra.main(version_base="1.3", config_path="pkg://slurmtrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = launch_one(cfg, _overrides())  # typed where it meets the schema: login/composed.py
    except ConfigError as err:  # exit here: Hydra would print its own banner first
        _refuse(str(err))
    except Exception as err:  # an interpolation met while resolving (${X} in cluster.env): as above
        line = one_line(err)
        if line is None:
            raise
        _refuse(line)
    if code:
        raise SystemExit(code)


def _compose_once(args: list[str]) -> None:
    """Hydra 1.3 composes the whole config twice per command: once only to read `hydra.mode`, a
    key conf/config.yaml leaves unset, then for the job. Unless the command line can set that key
    (a hydra.* override, another config file), the first answer is known: None, which Hydra's
    own fallback turns into RUN, or MULTIRUN with -m. Saves ~70 ms, a seventh of a dry run."""
    if any("hydra" in a or a.startswith(("--config", "-c")) for a in args):
        return
    from hydra._internal.hydra import Hydra  # private API: only when the patch applies

    Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]  # on purpose


def _command(args: list[str]) -> bool:
    """Whether argv is a command (`status`, `logs`, ...; a misspelt one too) or `--help` alone,
    not a training run: a first word that is not an override (those hold '=' or start with '+',
    '~' or '-') is a command, for Hydra would refuse it ("Error parsing override")."""
    if not args:
        return False
    first = args[0]
    return args in (["-h"], ["--help"]) or (
        "=" not in first and not first.startswith(("+", "~", "-"))
    )


def main() -> None:
    if _command(sys.argv[1:]):
        from slurmtrain.cli.__main__ import dispatch

        raise SystemExit(dispatch(sys.argv[1:]))
    # Let Hydra's exceptions reach us so they become one line instead of Hydra's report.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _compose_once(sys.argv[1:])
    try:
        _hydra_main()
    except ConfigError as err:
        _refuse(str(err))
    except Exception as err:  # noqa: BLE001  Hydra/OmegaConf composition errors
        line = one_line(err)
        if line is None:
            raise
        _refuse(line)


if __name__ == "__main__":
    main()
