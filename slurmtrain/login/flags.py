"""The one place Slurm flags come from: the submitit path and the job.sbatch template both read it.

Why here: a flag added to one path and not the other is how a hand-resubmitted job behaves unlike
the original. Values are checked before they reach any script: a value that cannot be quoted safely
(newline, shell metacharacter in an `#SBATCH` line, which sbatch parses itself) is refused with one
line naming the key.
"""

from __future__ import annotations

import re
import shlex
import sys
from typing import Optional, Union

from omegaconf import OmegaConf

from slurmtrain.common import secrets
from slurmtrain.common.derived import derived_of
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.schema import RootConfig
from slurmtrain.common.slurm_text import FIXED_PORT_VAR, PartitionInfo
from slurmtrain.login import container, owned_flags, stage_env

# What an #SBATCH value may contain: hostlists, times, memory sizes, key=value lists, paths.
SAFE_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_.,:=@%+/\-\[\]]*$")
SRUN_FIXED = ["--kill-on-bad-exit=1", "--wait=60"]
# Tasks block-wise over nodes (rank r on node r // tasks: what placement assumes) and each task's
# cores block-wise within the node: consecutive cores on one socket, near its GPU's NUMA node.
# srun's default (block:cyclic) deals a task's cores round-robin over the sockets, so with
# --cpu-bind=cores half of every rank's cores (and its loader's memory) sit on the far socket.
DISTRIBUTION = "block:block"
# CPU ranks train opt125m-sized models at most: anything bigger on a partition without GPUs is
# a plan that fell to CPU by accident (cluster=auto on a default CPU partition), not a run.
CPU_PLAN_MAX_PARAMS = 130_000_000
# NCCL's error handling stays torch's (TORCH_NCCL_ASYNC_ERROR_HANDLING=3: tear down the failed
# communicator without aborting it, so a rank on an NCCL error exits instead of hanging in
# ncclCommAbort until the heartbeat monitor kills it); cluster.env may still set it.
NCCL_DEFAULTS = {
    "NCCL_DEBUG": "WARN",
    "PYTHONUNBUFFERED": "1",
    "PYTHONWARNINGS": "ignore::FutureWarning",
}

# GPU jobs only; cluster.env overrides any of them.
GPU_DEFAULTS = {
    # NCCL flight recorder: the last collectives of every rank, dumped by our watchdog when a phase
    # hangs (compute/distributed.dump_collectives) or by NCCL's on its timeout, into RUN_DIR/logs
    # (job.sbatch.j2), so a hang names the collective and the rank that never joined it.
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    # Growable segments: no fragmentation OOM when activation sizes change (eval, last batch).
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}

Flag = Union[str, bool]


def checked(key: str, value: object) -> str:
    text = str(value)
    if not SAFE_SBATCH_VALUE.match(text):
        shown = text.replace("\n", "\\n")
        raise ConfigError(
            f"{key}={shown!r}: not allowed in a Slurm batch script (only letters, "
            f"digits and _.,:=@%+/-[]); fix the value"
        )
    return text


def sbatch_options(cfg: RootConfig, job_name: str) -> dict[str, Flag]:
    """Long sbatch options (no leading dashes) -> value, or True for a bare flag."""
    c = cfg.cluster
    low, high = derived_of(cfg).nodes
    spares = int(cfg.faults.spare_nodes)
    low, high = low + spares, high + spares  # spares idle beside the training nodes
    opts: dict[str, Flag] = {
        "job-name": checked("name", job_name),
        "nodes": f"{low}-{high}" if high != low else str(low),
        # A range with --ntasks-per-node gets its smaller end (Slurm derives ntasks from it, at
        # submission); --mincpus reserves each node's cores instead, and every srun step names
        # its own node and task counts (job.sbatch.j2).
        **(
            {"ntasks-per-node": str(derived_of(cfg).per_node)}
            if high == low
            else {"mincpus": str(derived_of(cfg).per_node * (cpus_given(cfg) or 1))}
        ),
        **({"cpus-per-task": str(cpus)} if (cpus := cpus_given(cfg)) else {}),
        "time": checked("cluster.time", c.time),
        # USR2, not USR1: NCCL catches USR1. Sent to every task `lead` seconds before the limit.
        "signal": f"USR2@{int(c.signal_lead_s)}",
        "requeue": True,
        "open-mode": "append",
    }
    if derived_of(cfg).in_allocation:
        opts["no-kill"] = True  # a node's death shrinks the allocation instead of ending the job
    if cfg.gpus_per_node > 0:
        opts["gpus-per-node"] = str(cfg.gpus_per_node)
    for key in ("partition", "account", "qos", "mem", "constraint", "exclude"):
        if getattr(c, key):
            opts[key] = checked(f"cluster.{key}", getattr(c, key))
    if cfg.gpus_per_node > 0 and c.mem_per_gpu and not c.mem:  # Slurm refuses both at once
        opts["mem-per-gpu"] = checked("cluster.mem_per_gpu", c.mem_per_gpu)
    if c.exclusive:
        opts["exclusive"] = True
    extra = extra_options(cfg)
    owned_flags.memory_merged(opts, extra, c.mem)  # a user --mem-per-cpu/-gpu replaces ours
    for option, value in extra.items():
        if option in ("comment", "dependency"):  # render_script's comment; the first sbatch's
            continue
        key = f"cluster.sbatch_extra.{option.replace('-', '_')}"
        opts[checked(key, option)] = True if value is True else checked(key, value)
    return opts


def extra_options(cfg: RootConfig) -> dict[str, object]:
    """cluster.sbatch_extra as sbatch's long options, what slurmtrain owns refused in one line
    (login/owned_flags.py)."""
    given = cfg.cluster.sbatch_extra  # a dict already in a checked config's view
    extra = OmegaConf.to_container(given, resolve=True) if OmegaConf.is_config(given) else given
    assert isinstance(extra, dict)
    return owned_flags.sbatch_extra({str(k): v for k, v in extra.items()})


def job_comment(cfg: RootConfig, tag: Optional[str]) -> Optional[str]:
    """#SBATCH --comment: the run's tag, and after a space the user's sbatch_extra.comment."""
    extra = extra_options(cfg)
    if "comment" in extra:
        checked("cluster.sbatch_extra.comment", extra["comment"])
    return owned_flags.comment(tag, extra)


def user_dependency(cfg: RootConfig) -> Optional[str]:
    """sbatch_extra.dependency: the first submission's only (never in job.sbatch: a later attempt
    or a hand resubmission must not wait for a job long gone)."""
    value = extra_options(cfg).get("dependency")
    return None if value is None else checked("cluster.sbatch_extra.dependency", value)


def sbatch_lines(opts: dict[str, Flag]) -> list[str]:
    return [f"#SBATCH --{k}" if v is True else f"#SBATCH --{k}={v}" for k, v in opts.items()]


def cpus_per_task(cfg: RootConfig) -> int:
    """Cores per task: cluster.cpus_per_task, filled from the partition (cores per GPU) by
    login/placement.py; 1 when nothing set it (a config composed outside the launch flow)."""
    value = cfg.cluster.cpus_per_task
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"cluster.cpus_per_task={value!r}: must be a positive integer; e.g. "
            f"cluster.cpus_per_task=8"
        )
    return value


def cpus_given(cfg: RootConfig) -> Optional[int]:
    """--cpus-per-task, or None: GPU ranks whose partition's cores are unknown (SLURMTRAIN_AUTO=off,
    no controller) ask for none rather than one core each; the site's default applies, and
    per_task_text says so (an 8-GPU job bound to 8 cores starves its data loaders)."""
    gpus = cfg.gpus_per_node
    if cfg.cluster.cpus_per_task is None and isinstance(gpus, int) and gpus > 0:
        return None
    return cpus_per_task(cfg)


def task_defaults(cfg: RootConfig, part: PartitionInfo) -> None:
    """Per-task resources left unset, from the partition the job lands in (mutates cfg).

    GPU ranks: --cpus-per-task = the node's cores over max(tasks per node, the node's GPUs): a
    whole-node job gets every core, a job on part of a node its GPUs' share (never the cores the
    node's other GPUs need). Memory for a job that takes whole GPU nodes: --mem=0, all of each
    node's memory, which is what an exclusive GPU node expects and what Slurm can always grant
    (node memory over GPUs x GPUs can exceed what a node may allocate: MemSpecLimit, smaller nodes
    in the partition); where the partition caps MaxMemPerNode, or the job shares the node,
    --mem-per-gpu = the node's (capped) memory over its GPUs. CPU ranks keep one core and the
    site's memory default: CPU jobs share small nodes (tests), and CPU plans are tiny models."""
    gpus = part.gpus_per_node
    if cfg.cluster.cpus_per_task is None:
        tasks = derived_of(cfg).per_node if cfg.gpus_per_node > 0 else 0
        share = max(tasks, gpus)
        cores = part.cpus_per_node
        cfg.cluster.cpus_per_task = max(1, cores // share) if tasks and cores else 1
    if cfg.gpus_per_node <= 0 or cfg.cluster.mem or cfg.cluster.mem_per_gpu is not None:
        return
    whole = gpus > 0 and cfg.gpus_per_node >= gpus
    if whole and part.max_mem_per_node_mb is None:
        cfg.cluster.mem = "0"
        return
    mem = part.mem_per_node_mb
    if part.max_mem_per_node_mb is not None:
        mem = min(mem or part.max_mem_per_node_mb, part.max_mem_per_node_mb)
    if mem and gpus:
        cfg.cluster.mem_per_gpu = f"{mem // gpus}M"


def cpu_plan_refusal(
    cfg: RootConfig, part: PartitionInfo, params: int, insisted: bool
) -> Optional[str]:
    """The one line refusing a model bigger than opt125m planned on CPU ranks on a partition
    without GPUs (None: fine). `insisted`: the user passed gpus_per_node=0 themselves."""
    if cfg.gpus_per_node > 0 or part.gpus > 0 or insisted or params <= CPU_PLAN_MAX_PARAMS:
        return None
    return (
        f"cluster.partition={part.name}: partition {part.name!r} has no GPUs, so "
        f"{cfg.model.name} ({params / 1e9:.2f}B parameters) would train on CPU ranks in fp32; "
        f"set cluster.partition=<a GPU partition>, or gpus_per_node=0 to insist"
    )


def per_task_text(cfg: RootConfig) -> str:
    """What each task is given, for the batch script's header (shown by the dry run)."""
    ncpus = cpus_given(cfg)
    c = cfg.cluster
    extra = extra_options(cfg)
    given = next((k for k in ("mem-per-cpu", "mem-per-gpu") if k in extra), None)
    if given:
        mem = f"--{given}={extra[given]} (cluster.sbatch_extra)"
    elif c.mem:
        mem = "all of each node's memory (--mem=0)" if str(c.mem) == "0" else f"--mem={c.mem}"
        if str(c.mem) != "0" and cfg.gpus_per_node > 0:
            mem += " per node"
        mem += f" shared by its {derived_of(cfg).per_node} tasks"
    elif cfg.gpus_per_node > 0 and c.mem_per_gpu:
        mem = f"{c.mem_per_gpu} (--mem-per-gpu, one GPU per task)"
    else:
        mem = "the site's default (no --mem)"
    bind = "" if str(c.cpu_bind) == "none" else f", cores bound {DISTRIBUTION}"
    cpus = (
        f"{ncpus} CPU{'s' if ncpus != 1 else ''} (--cpus-per-task)"
        if ncpus
        else "the site's CPUs per GPU (DefCpuPerGPU, else 1; --cpus-per-task unset: the "
        "partition's cores are unknown, set cluster.cpus_per_task=N)"
    )
    return f"{cpus}; memory: {mem}{bind}"


def srun_args(cfg: RootConfig) -> list[str]:
    """Arguments for srun (argument list: each is quoted when rendered into a script).

    --cpus-per-task is repeated here: srun in Slurm 22.05-23.02 does not inherit it from the batch
    allocation (SLURM_CPUS_PER_TASK), so without it every rank is bound to one core. --cpu-bind
    keeps each rank's data loader and Python threads on its own cores, --distribution=block:block
    keeps them on one socket (DISTRIBUTION); a --distribution/-m in cluster.srun_extra wins."""
    cpus = cpus_given(cfg)
    args = [f"--cpus-per-task={cpus}"] if cpus else []
    bind = str(cfg.cluster.cpu_bind)
    extra, _ = container.split_srun_extra(cfg)  # pyxis' own flags: container.pyxis_args
    if bind != "none":
        args.append(f"--cpu-bind={checked('cluster.cpu_bind', bind)}")
        if not any(a.startswith(("--distribution", "-m")) for a in extra):
            args.append(f"--distribution={DISTRIBUTION}")
    owned_flags.srun_extra(extra)  # a flag we own (--ntasks, --output...): refused, one line
    args += list(SRUN_FIXED) + extra
    for arg in args:
        if "\n" in arg or "\r" in arg:
            raise ConfigError(
                f"cluster.srun_extra={arg!r}: newlines are not allowed; fix the value"
            )
    if cfg.cluster.container == "pyxis":
        args += container.pyxis_args(cfg)
    return args


def flight_recorder(cfg: RootConfig) -> bool:
    """Whether the batch script points the flight recorder's dumps at RUN_DIR/logs: GPU jobs
    (the recorder is on), unless cluster.env names the file itself."""
    env = dict(cfg.cluster.env)
    return cfg.gpus_per_node > 0 and not any(
        k in env for k in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
    )


def job_env(cfg: RootConfig) -> dict[str, str]:
    """The job's environment as configured: our defaults, then cluster.env (values unexpanded)."""
    env = dict(NCCL_DEFAULTS)
    if cfg.gpus_per_node == 0:
        env["DS_ACCELERATOR"] = "cpu"
    else:
        env.update(GPU_DEFAULTS)
    for key, value in dict(cfg.cluster.env).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise ConfigError(f"cluster.env.{key}: not a valid environment variable name")
        if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", str(value)):
            raise ConfigError(
                f"cluster.env.{key}: control characters (a newline) are not allowed in a "
                f"value; fix the value"
            )
        env[str(key)] = str(value)
    return env


# $NAME and ${NAME}: what expands at job time in a cluster.env value (all else is literal).
EXPANDS = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def shell_value(value: str) -> str:
    """`value` in double quotes for an `export NAME=...` line: $NAME and ${NAME} expand when the
    batch shell runs it (on the compute node, at job time); every other `$`, `"`, `\\` and
    backtick is escaped, so no command substitution, quote or `;` in it reaches the shell."""
    out, at = [], 0
    for m in EXPANDS.finditer(value):
        out.append(re.sub(r'([$"\\`])', r"\\\1", value[at : m.start()]))
        out.append(m.group(0))
        at = m.end()
    out.append(re.sub(r'([$"\\`])', r"\\\1", value[at:]))
    return '"' + "".join(out) + '"'


def expanded(value: str, env: dict[str, str]) -> str:
    """What the batch shell makes of shell_value(value) with `env` (local runs: no shell)."""
    return EXPANDS.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def script_env(cfg: RootConfig) -> dict[str, str]:
    """NAME -> the text after `export NAME=` in job.sbatch: our defaults (quoted), cluster.env
    entries that are configuration (shell_value), not those that are secrets (secrets.env)."""
    own = dict(cfg.cluster.env)
    out = {
        k: shell_value(v) if k in own else shlex.quote(v)
        for k, v in job_env(cfg).items()
        if k not in own or not secrets.is_secret_key(f"{secrets.ENV_KEY}.{k}", v)
    }
    port = master_port(cfg)
    if port is not None:  # every srun step's rendezvous (slurm_text.rendezvous_from_env)
        out[FIXED_PORT_VAR] = str(port)
    return out


def master_port(cfg: RootConfig) -> Optional[int]:
    """cluster.master_port (None: derived from the job id and step), checked."""
    port = cfg.cluster.master_port
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise ConfigError(
            f"cluster.master_port={port!r}: a TCP port 1024..65535 (the one your site opens "
            f"between nodes), or null to derive it from the job id"
        )
    return port


def port_note(cfg: RootConfig) -> Optional[str]:
    """The plan's line on a fixed cluster.master_port: where it can collide (None: derived)."""
    port = master_port(cfg)
    if port is None:
        return None
    shared = (
        "this job holds its nodes (cluster.exclusive=true): no other job binds it there"
        if cfg.cluster.exclusive
        else "two jobs whose rank 0 share a node collide (EADDRINUSE: a sweep's points, or "
        "another run there); cluster.exclusive=true keeps the node to this job"
    )
    return (
        f"plan: rendezvous on the fixed port {port} (cluster.master_port): {shared}; restarts "
        f"in the allocation reuse it once the previous step has exited (srun returned, its "
        f"listening socket closed; torch's store binds with SO_REUSEADDR, so TIME_WAIT does not "
        f"block it)"
    )


def local_env(cfg: RootConfig, base: dict[str, str]) -> dict[str, str]:
    """cluster.env's configuration entries as the batch shell would export them, expanded one
    after the other against `base` (the local backend's environment)."""
    env, out = dict(base), {}
    for key, value in dict(cfg.cluster.env).items():
        if not secrets.is_secret_key(f"{secrets.ENV_KEY}.{key}", value):
            env[str(key)] = out[str(key)] = expanded(str(value), env)
    return out


def python_command(cfg: RootConfig) -> list[str]:
    """The interpreter on the compute node, inside the container when there is one."""
    if cfg.cluster.container == "apptainer":
        return container.apptainer_command(cfg)
    if cfg.cluster.container == "pyxis":
        return ["python"]
    if cfg.cluster.container == "oci":
        container.check_image(cfg)  # one line now, not a job that cannot start its Python
        return [container.IMAGE_PYTHON]
    # each node's own copy of the venv (login/stage_env.py)
    if cfg.cluster.stage_env:
        return stage_env.python_command(cfg, [sys.executable])
    return [sys.executable]


def container_srun_args(cfg: RootConfig) -> list[str]:
    """srun's own container flags for the in-image supervisor's step: exactly the ranks' pyxis
    flags (apptainer wraps the command, python_command; oci runs the job script's oci_task)."""
    return container.pyxis_args(cfg) if cfg.cluster.container == "pyxis" else []


def host_python(cfg: RootConfig) -> str:
    """The batch shell's Python: cluster.host_python, else the one submitting (shared /home)."""
    return str(cfg.cluster.host_python or sys.executable)


def quote_all(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
