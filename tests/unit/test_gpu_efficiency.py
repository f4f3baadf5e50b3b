"""The GPU settings slurmtrain trains with (pure: config and job environment, no GPU needed)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from slurmtrain.common import ds_config, schema
from slurmtrain.login import flags


def _cfg(*overrides: str):
    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["cluster=local", *overrides])
    return cfg


def test_overlap_comm_is_on_with_buckets_scaled_by_hidden_size():
    for stage in (1, 2, 3):
        zero = ds_config.zero_section(_cfg(f"deepspeed=zero{stage}", "model=opt1.3b"))
        assert zero["overlap_comm"] is True
        assert zero["reduce_bucket_size"] == 12 * 2048**2  # one layer's gradients
    assert ds_config.bucket_elements(768) == 2e7  # small models: not below the floor
    assert ds_config.bucket_elements(7168) == 5e8  # opt66b: DeepSpeed's default as the cap
    assert "overlap_comm" not in ds_config.zero_section(_cfg("deepspeed=zero0"))
    # deepspeed.extra still wins
    extra = _cfg("deepspeed=zero2", "+deepspeed.extra.zero_optimization.overlap_comm=false")
    assert ds_config.zero_section(extra)["overlap_comm"] is False


def test_the_planner_reads_the_buckets_it_trains_with():
    from slurmtrain.planning import preflight

    cfg = _cfg("deepspeed=zero2", "model=opt1.3b", "gpus_per_node=8")
    assert preflight._buckets(cfg) == {"reduce_bucket": 12 * 2048**2, "overlap_comm": True}


def test_gpu_jobs_get_the_nccl_flight_recorder_and_expandable_segments():
    gpu = flags.job_env(_cfg("gpus_per_node=8"))
    assert gpu["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert int(gpu["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert gpu["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    cpu = flags.job_env(_cfg("gpus_per_node=0"))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in cpu and cpu["DS_ACCELERATOR"] == "cpu"
    mine = flags.job_env(_cfg("gpus_per_node=8", "+cluster.env.PYTORCH_CUDA_ALLOC_CONF=x"))
    assert mine["PYTORCH_CUDA_ALLOC_CONF"] == "x"  # the user's cluster.env wins


def test_nccl_error_handling_is_left_at_torchs_default_unless_the_user_sets_it(monkeypatch):
    """torch's default (3) tears a failed communicator down without ncclCommAbort, where 1 could
    hang there until the heartbeat monitor kills the rank."""
    from slurmtrain.compute import attempt
    from slurmtrain.login import slurm_submit

    key = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    cfg = _cfg("gpus_per_node=8")
    assert key not in flags.job_env(cfg)
    script = slurm_submit.render_script(cfg, "/runs/r/abc", flags.sbatch_options(cfg, "r"), "b")
    assert key not in script
    monkeypatch.delenv(key, raising=False)
    attempt._quiet_environment(cpu=False)
    assert key not in attempt.os.environ
    mine = _cfg("gpus_per_node=8", f"+cluster.env.{key}=1")
    assert flags.job_env(mine)[key] == "1"  # the user's choice still reaches the ranks
