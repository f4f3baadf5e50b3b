"""`python -m slurmtrain [KEY=VALUE ...]`: compose -> validate -> plan -> run directory -> submit.

Login-node code: nothing imported here pulls in torch, deepspeed or transformers, so a dry run takes
under half a second (bench/dry_run_speed.py). Every user mistake ends as one line (key, value, fix)
and exit code 2.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from slurmtrain.common import schema
from slurmtrain.common.errors import EXIT_CONFIG, ConfigError
from slurmtrain.common.hydra_errors import one_line
from slurmtrain.common.secrets import redact_text
from slurmtrain.login.launch import launch_one

schema.register()


def _overrides() -> list[str]:
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # composed outside Hydra's main (tests)
        return []


@hydra.main(version_base="1.3", config_path="pkg://slurmtrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = launch_one(cfg, _overrides())  # typed where it meets the schema: login/composed.py
    except ConfigError as err:  # exit here: Hydra would print its own banner first
        print(f"slurmtrain: error: {redact_text(str(err))}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except Exception as err:  # an interpolation met while resolving (${X} in cluster.env): as above
        line = one_line(err)
        if line is None:
            raise
        print(f"slurmtrain: error: {redact_text(line)}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
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


def main() -> None:
    # Let Hydra's exceptions reach us so they become one line instead of Hydra's report.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _compose_once(sys.argv[1:])
    try:
        _hydra_main()
    except ConfigError as err:
        print(f"slurmtrain: error: {redact_text(str(err))}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except Exception as err:  # noqa: BLE001  Hydra/OmegaConf composition errors
        line = one_line(err)
        if line is None:
            raise
        print(f"slurmtrain: error: {redact_text(line)}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


if __name__ == "__main__":
    main()
