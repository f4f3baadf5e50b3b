"""The `cluster` section of the schema: where and how the job runs (Slurm flags, containers, the
batch shell's Python, node-local environments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum  # Python 3.11 (pyproject.toml's requires-python)
from typing import Any, Optional

__all__ = ["ClusterConfig", "ClusterKind", "Container", "StrEnum"]


class ClusterKind(StrEnum):
    auto = "auto"  # Slurm when it answers, else local (login/placement.py resolves it)
    local = "local"
    slurm = "slurm"


class Container(StrEnum):
    none = "none"
    apptainer = "apptainer"
    pyxis = "pyxis"
    oci = "oci"  # an OCI bundle, one runc per task


@dataclass
class ClusterConfig:
    kind: ClusterKind = ClusterKind.local
    cpu_tasks_per_node: int = 2  # tasks per node when gpus_per_node == 0
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    # auto: the partition's MaxTime capped at time_cap (the cap when the partition is unknown);
    # time_from says which (filled on the login node, planning/policy.py).
    time: str = "auto"
    time_cap: str = "48:00:00"
    time_from: Optional[str] = None
    # None: on Slurm GPU runs the node's cores per GPU (partition CPUs / GPUs), else 1; passed to
    # srun too (Slurm 22.05-23.02 srun does not inherit it) with --cpu-bind=cores.
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None  # --mem per node; set it or mem_per_gpu
    mem_per_gpu: Optional[str] = None  # None on Slurm GPU runs: the node's memory over its GPUs
    cpu_bind: str = "cores"  # srun --cpu-bind (none: leave binding to the site)
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    exclusive: bool = False
    signal_lead_s: int = 120
    array_parallelism: int = 16  # %N throttle of a sweep's job array
    # The card the plan is for (peak TFLOPS, MFU table, memory): a name (H100, h200, a100_80gb),
    # or auto: the partition's GRES type where it names one, else an H100 (planning/cards.py).
    gpu_type: str = "auto"
    # What the memory plan must fit into, per GPU, in GiB as the card reports it
    # (torch.cuda.mem_get_info()[1] / 2**30: an H100 80GB reports ~79.1); auto: gpu_type's.
    gpu_mem_gb: Any = "auto"
    cpu_mem_gb: Optional[float] = None  # host memory per node (checked for offload plans)
    container: Container = Container.none
    image: Optional[str] = None  # .sif (apptainer), REGISTRY#IMAGE/.sqsh (pyxis), bundle dir (oci)
    # More paths inside the container, each SRC[:DST[:ro]] (absolute paths; DST defaults to SRC):
    # apptainer --bind, pyxis --container-mounts, oci bind mounts. The runs root is always
    # mounted; data files and model.pretrained_path outside it are mounted read-only by themselves.
    container_binds: list[str] = field(default_factory=list)
    # The runtime's own extra flags: `apptainer exec` flags (--cleanenv, --contain) or pyxis' srun
    # flags (--no-container-mount-home, --container-workdir=DIR); the ranks' and the in-image
    # supervisor's steps get the same ones (login/container.py).
    container_flags: list[str] = field(default_factory=list)
    apptainer_binary: str = "apptainer"  # or singularity, or an absolute path to either
    apptainer_gpu: str = "nv"  # nv (--nv, NVIDIA), rocm (--rocm, AMD) or none
    # The batch shell's Python (runs the supervisor when it can import slurmtrain; else, with a
    # container, the supervisor runs inside the image). None: the Python that submitted.
    host_python: Optional[str] = None
    sbatch_extra: dict[str, Any] = field(default_factory=dict)  # #SBATCH --key=value, any value
    srun_extra: list[str] = field(default_factory=list)
    # The job's environment, configuration: in job.sbatch and the dry run, exported by the batch
    # shell, so $VAR and ${VAR} expand on the compute node at job time (docs/usage.md: Environment).
    # An entry named like a credential (WANDB_API_KEY) is a secret: kept in the run's 0600 file.
    env: dict[str, str] = field(default_factory=dict)
    # Shell lines the batch script runs in its own shell before the first srun of every attempt
    # (module load, conda activate, source site_env.sh): a list, or one string of lines. They are
    # the user's shell code, written into job.sbatch as given (a hand resubmission runs them too),
    # after cluster.env is exported; what they set reaches the ranks and the supervisor. A failing
    # line stops the run with class setup_failed (slurmtrain.batch.setup_failed).
    setup: Any = field(default_factory=list)
    # Secrets by name: each variable's value is read from the submitting shell into the run's 0600
    # secrets.env (common/secrets.py); never in argv, config.yaml or job.sbatch.
    secrets: list[str] = field(default_factory=list)
    # The rendezvous port; None: derived from the job id and srun step (common/slurm_text.py).
    master_port: Optional[int] = None
    # Import storms at scale: every rank runs Python from a node-local copy of the submitting venv,
    # packed once on the login node and unpacked once per node (login/stage_env.py, docs/scale.md).
    stage_env: bool = False
    stage_env_dir: str = "/tmp"  # the node-local directory each node's copy goes in
    stage_env_cache: Optional[str] = (
        None  # the packs (read by every node); None: runs_root/.env_packs
    )


def setup_lines(setup: object) -> list[str]:
    """cluster.setup as the batch script's lines: a string's lines, or the list's items (blank
    ones dropped)."""
    items = setup.splitlines() if isinstance(setup, str) else list(setup or [])  # type: ignore[call-overload]
    return [str(line) for line in items if str(line).strip()]
