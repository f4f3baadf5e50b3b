"""`python -m slurmtrain [KEY=VALUE ...]`: compose -> validate -> plan -> run directory -> submit.

Login-node code: nothing imported here pulls in torch, deepspeed or transformers, so a dry run takes
about a second. Every user mistake ends as one line (key, value, fix) and exit code 2.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from slurmtrain import config as schema
from slurmtrain.errors import EXIT_CONFIG, ConfigError
from slurmtrain.hydra_errors import one_line

schema.register()


def _overrides() -> list[str]:
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # composed outside Hydra's main (tests)
        return []


def launch(cfg: DictConfig, overrides: list[str]) -> int:
    """Everything after composition; returns the exit code."""
    from slurmtrain import planning, runs

    cfg.runs_root = os.path.abspath(os.path.expanduser(cfg.runs_root))
    schema.validate(cfg, submitting=not cfg.dry_run)
    report = planning.report(cfg)
    if cfg.dry_run:
        print(OmegaConf.to_yaml(cfg, resolve=True))
        print(report.text)
        return 0
    report.enforce(cfg)  # before printing: a refusal is one line
    print(report.text)
    run = runs.locate(cfg)
    state = run.state()
    if state == runs.FINISHED:
        print(f"slurmtrain: this run already finished: {run.path}\n"
              f"slurmtrain: nothing to train; pass new_run=true to train the same config again")
        return 0
    if state == runs.RUNNING:
        print(f"slurmtrain: this run is already queued or running: {run.path}")
        return 0
    if state == runs.STOPPED:
        print(f"slurmtrain: resuming unfinished run {run.path}")
    runs.create(run, cfg, overrides)
    from slurmtrain import provenance

    provenance.write(run.provenance, f"submit_{len(run.events('submitted')) + 1}",
                     extra={"overrides": overrides})
    from slurmtrain.submit import submit

    result = submit(cfg, run)
    if result.finished:
        print(f"slurmtrain: run finished: {run.path}")
    return result.exit_code


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = launch(cfg, _overrides())
    except ConfigError as err:  # exit here: Hydra would print its own banner first
        print(f"slurmtrain: error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    if code:
        raise SystemExit(code)


def main() -> None:
    # Let Hydra's exceptions reach us so they become one line instead of Hydra's report.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _hydra_main()
    except ConfigError as err:
        print(f"slurmtrain: error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except Exception as err:  # noqa: BLE001  Hydra/OmegaConf composition errors
        line = one_line(err)
        if line is None:
            raise
        print(f"slurmtrain: error: {line}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


if __name__ == "__main__":
    main()
