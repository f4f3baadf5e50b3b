"""Sweeps as one job array that returns at once.

Hydra's own submitit launcher blocks until every job ends. This one composes every sweep point,
validates and plans all of them before anything is queued (one bad point: nothing submitted), skips
points already finished or running (each point has its own run directory and fingerprint), and
submits the rest as a single `sbatch --array` (cluster=slurm) or runs them one after the other
(cluster=local).
"""


from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class SlurmtrainLauncherConf:
    _target_: str = "hydra_plugins.slurmtrain_launcher.launcher.SlurmtrainLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="slurmtrain",
                             node=SlurmtrainLauncherConf, provider="slurmtrain")


class SlurmtrainLauncher(Launcher):
    def __init__(self, **_: Any) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from slurmtrain import launch

        assert self.config is not None and self.hydra_context is not None
        points = []
        for overrides in job_overrides:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            points.append((launch.resolve(cfg), list(overrides)))
        if any(cfg.dry_run for cfg, _ in points):
            for cfg, overrides in points:
                print(f"sweep point: {' '.join(overrides)}")
                launch.launch_one(cfg, overrides)
            return [_done(o, 0) for _, o in points]
        todo = []
        for cfg, overrides in points:
            prepared = launch.check(cfg, quiet=True)
            if prepared is not None:
                todo.append((prepared, overrides))
        if not todo:
            print(f"slurmtrain: all {len(points)} sweep points are finished or queued; "
                  f"nothing submitted")
            return [_done(o, 0) for _, o in points]
        for prepared, overrides in todo:
            launch.record(prepared, overrides)
        if todo[0][0].cfg.cluster.kind == "slurm":
            from slurmtrain.submit.slurm import submit_array

            folder = Path(todo[0][0].cfg.runs_root) / ".sweeps" / "submitit"
            subs = submit_array([(p.cfg, p.run) for p, _ in todo], folder)
            array = subs[0].job_id.split("_")[0]
            print(f"slurmtrain: submitted job array {array} with {len(subs)} of "
                  f"{len(points)} sweep points")
            for sub, (p, _) in zip(subs, todo):
                print(f"  {sub.job_id}  {p.run.path}")
        else:
            from slurmtrain.submit import submit

            for p, _ in todo:
                submit(p.cfg, p.run)
        return [_done(o, 0) for _, o in points]


def _done(overrides: Sequence[str], value: int) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = value
    return ret
