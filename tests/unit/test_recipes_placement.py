"""OPT recipes compose under overrides; cluster/gpus auto-detection; device lookup; srun resources."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.common import ds_config, schema, validation
from slurmtrain.common.errors import ConfigError
from slurmtrain.common.slurm_text import parse_partitions
from slurmtrain.compute.distributed import DeviceError, device_index
from slurmtrain.login import flags, placement
from tests.conftest import run_cli

schema.register()
M = 1024 * 1024
# (size, peak lr, batch in M tokens) from metaseq/launcher/opt_job_constants.py MODEL_SIZES.
OPT = [
    ("opt125m", 6e-4, 0.5),
    ("opt350m", 3e-4, 0.5),
    ("opt1.3b", 2e-4, 1),
    ("opt2.7b", 1.6e-4, 1),
    ("opt6.7b", 1.2e-4, 2),
    ("opt13b", 1e-4, 4),
    ("opt30b", 1e-4, 4),
    ("opt66b", 8e-5, 2),
]


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=local", "gpus_per_node=0", *overrides])
    validation.validate_config(cfg, submitting=False)
    return cfg


@pytest.mark.parametrize("size,lr,batch_m", OPT)
def test_each_opt_size_trains_with_the_papers_recipe(size, lr, batch_m):
    cfg = _cfg(f"model={size}")
    tokens = int(batch_m * M)
    assert cfg.data.seq_len == 2048 and cfg.train.global_batch_size == tokens // 2048
    assert cfg.optim.lr == lr and cfg.optim.min_lr == pytest.approx(0.1 * lr)
    assert (cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps) == (0.9, 0.95, 1e-8)
    assert cfg.optim.weight_decay == 0.1 and cfg.optim.grad_clip == 1.0
    assert cfg.optim.warmup_steps == int(375e6) // tokens  # metaseq: warm-up over 375M tokens
    assert cfg.train.max_steps == int(300e9) // tokens  # and 300B tokens in all
    assert (cfg.model.dropout, cfg.model.init_std, cfg.model.scaled_init) == (0.1, 0.006, True)
    # metaseq's schedule: from 0 (first update at peak / warm-up) to the peak, then to 10% of it
    # at the last step (ds_config.lr_scheduler, stepped by DeepSpeed).
    w, t, floor = cfg.optim.warmup_steps, cfg.train.max_steps, cfg.optim.min_lr
    assert ds_config.lr_at(0, lr, floor, w, t) == pytest.approx(lr / w)
    assert ds_config.lr_at(w - 1, lr, floor, w, t) == pytest.approx(lr)
    assert ds_config.lr_at(t - 1, lr, floor, w, t) == pytest.approx(0.1 * lr)


def test_half_a_million_tokens_is_256_sequences_and_overrides_win():
    assert _cfg("model=opt125m").train.global_batch_size == 256
    cfg = _cfg(
        "model=opt13b",
        "optim.lr=3e-4",
        "train.max_steps=20",
        "data.seq_len=1024",
        "model.dropout=0.0",
        "optim.warmup_steps=5",
    )
    assert (cfg.optim.lr, cfg.train.max_steps, cfg.model.dropout) == (3e-4, 20, 0.0)
    assert cfg.train.global_batch_size == 4096 and cfg.optim.warmup_steps == 5  # 4M / 1024
    assert _cfg("model=opt13b", "train.tokens=1e9").train.max_steps == int(1e9) // (4 * M)
    assert _cfg("model=opt13b", "train.global_batch_size=64").train.global_batch_size == 64


def test_opt_tiny_keeps_the_demo_recipe():
    cfg = _cfg()
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps) == (
        1e-3,
        pytest.approx(1e-4),
        10,
    )
    assert (cfg.data.seq_len, cfg.train.max_steps, cfg.optim.weight_decay) == (128, 200, 0.01)
    assert (cfg.model.dropout, cfg.model.init_std, cfg.model.scaled_init) == (0.0, 0.02, False)
    assert cfg.train.global_batch_size == 4 * 2  # micro x accumulation x 2 local CPU ranks


def test_a_batch_in_tokens_that_is_not_whole_sequences_is_one_line():
    with pytest.raises(ConfigError, match=r"train.global_batch_tokens=1000: .*data.seq_len=2048"):
        _cfg("model=opt125m", "train.global_batch_tokens=1000")


def test_unresolved_auto_is_refused_naming_the_keys():
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config")
    assert cfg.cluster.kind == "auto" and cfg.gpus_per_node == "auto"
    with pytest.raises(ConfigError, match="auto: not resolved"):
        validation.validate_config(cfg)


def test_auto_off_is_the_embedded_default(monkeypatch):
    monkeypatch.setenv("SLURMTRAIN_AUTO", "off")
    monkeypatch.setattr(placement, "_probe_cache", {})
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config")
    placement.resolve_auto(cfg)
    assert (cfg.cluster.kind, cfg.gpus_per_node, cfg.cluster.cpu_tasks_per_node) == ("local", 0, 2)
    assert cfg.cluster.cpus_per_task == 1


def test_no_sbatch_on_path_means_this_machine(monkeypatch):
    monkeypatch.setattr(placement, "_probe_cache", {})
    probe = placement.probe_slurm({"PATH": "/nonexistent"})
    assert probe.partitions is None and probe.why == "no sbatch on PATH"


def test_nvidia_smi_lines_count_gpus_not_mig_instances():
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
        "  MIG 3g.40gb     Device  0: (UUID: MIG-a)\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
    )
    assert placement.parse_nvidia_smi_l(text) == 2 and placement.parse_nvidia_smi_l("") == 0


GPU_PART = (
    "PartitionName=gpu Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=g[1-2] "
    "State=UP TotalCPUs=192 TotalNodes=2 TRES=cpu=192,mem=2000G,node=2,billing=192,"
    "gres/gpu=16\n"
)


def test_slurm_gpu_runs_ask_for_cores_and_memory_per_gpu_and_bind_cores():
    part = parse_partitions(GPU_PART)["gpu"]
    assert placement.node_resources(part) == (96, 1000 * 1024, 8)
    cfg = _cfg("gpus_per_node=8", "model=opt1.3b")
    cfg.cluster.cpus_per_task = None
    placement.slurm_defaults(cfg, part)
    # Whole GPU nodes: all of each node's memory (--mem=0), not memory per GPU.
    assert cfg.cluster.cpus_per_task == 12 and cfg.cluster.mem == "0"
    opts = flags.sbatch_options(cfg, "x")
    assert opts["cpus-per-task"] == "12" and opts["mem"] == "0" and "mem-per-gpu" not in opts
    assert opts["gpus-per-node"] == "8"
    srun = flags.srun_args(cfg)
    assert "--cpus-per-task=12" in srun and "--cpu-bind=cores" in srun  # srun does not inherit it
    half = _cfg("gpus_per_node=4", "model=opt1.3b")  # half a node: its GPUs' share of both
    half.cluster.cpus_per_task = None
    placement.slurm_defaults(half, part)
    assert half.cluster.cpus_per_task == 12 and half.cluster.mem_per_gpu == "128000M"
    half.cluster.mem = "500G"  # an explicit --mem replaces --mem-per-gpu (Slurm refuses both)
    assert "mem-per-gpu" not in flags.sbatch_options(half, "x")


@pytest.mark.parametrize(
    "env,visible,local_rank,want",
    [
        ({}, 8, 3, 3),  # all of the node's GPUs visible: the local rank's
        ({"CUDA_VISIBLE_DEVICES": "5"}, 1, 1, 0),  # one GPU per task: it is device 0
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_NTASKS_PER_NODE": "4"}, 4, 2, 2),
        # a site binding 2 of 4 step GPUs per task, physical ids visible: found by id
        (
            {
                "CUDA_VISIBLE_DEVICES": "2,3",
                "SLURM_STEP_GPUS": "0,1,2,3",
                "SLURM_NTASKS_PER_NODE": "4",
            },
            2,
            3,
            1,
        ),
    ],
)
def test_device_index_finds_the_ranks_device_among_those_it_sees(env, visible, local_rank, want):
    assert device_index(env, visible, local_rank) == want


def test_device_index_refuses_what_it_cannot_tell_in_one_message():
    with pytest.raises(
        DeviceError, match=r"local rank 2 of 3 tasks .* sees 2 devices.*--gpus-per-task=1"
    ):
        device_index({"CUDA_VISIBLE_DEVICES": "4,5", "LOCAL_WORLD_SIZE": "3"}, 2, 2)


def test_dry_run_exits_2_where_the_real_command_would_be_refused(workdir):
    misfit = ["model=opt66b", "nodes=1", "gpus_per_node=8", "deepspeed=zero2", "dry_run=true"]
    done = run_cli(misfit, cwd=workdir)
    assert done.returncode == 2 and "plan: memory/GPU" in done.stdout
    assert "does not fit" in done.stderr and not (workdir / "runs").exists()
    fine = run_cli(["model=opt125m", "gpus_per_node=8", "dry_run=true"], cwd=workdir)
    assert fine.returncode == 0, fine.stderr


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H800 80GB HBM3", 989.4),
        ("NVIDIA A800-SXM4-80GB", 312.0),
        ("NVIDIA H20", 148.0),
        ("NVIDIA H200", 989.4),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
    ],
)
def test_peak_table_knows_the_export_and_blackwell_parts_dense_bf16(name, peak):
    from slurmtrain.planning.flops import detect_peak

    assert detect_peak(name, "bf16") == peak
