"""#36 Build 8's small items: what a message says given what the user gave or what was found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from slurmtrain.cli.log_merge import Traceback
from slurmtrain.common import schema
from slurmtrain.common.errors import ConfigError
from slurmtrain.login import flags, placement
from slurmtrain.login.local_submit import sample_prompt

schema.register()


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_gpus_auto_with_a_partition_given_asks_only_for_the_gpus(monkeypatch):
    """`cluster=slurm cluster.partition=gpu` where Slurm cannot be read: the partition was given,
    so the fix is gpus_per_node=N (it asked for `... or cluster.partition=NAME`)."""
    monkeypatch.delenv(placement.ENV, raising=False)  # off: CPU ranks, nothing to ask
    unread = placement.Probe(None, "no sbatch on PATH")
    monkeypatch.setattr(placement, "_probe_cache", {"slurm": unread, "slurm-asked": unread})
    monkeypatch.setattr(placement, "probe_slurm", lambda *a, **k: unread)
    cfg = _cfg("cluster=slurm", "cluster.partition=gpu", "gpus_per_node=auto")
    with pytest.raises(ConfigError) as err:
        placement.resolve_auto(cfg)
    assert "set gpus_per_node=N, the GPUs of a gpu node" in str(err.value)
    assert "cluster.partition=NAME" not in str(err.value)
    cfg = _cfg("cluster=slurm", "gpus_per_node=auto")
    with pytest.raises(ConfigError, match=r"gpus_per_node=N or cluster.partition=NAME"):
        placement.resolve_auto(cfg)


def test_gpu_ranks_on_an_unknown_partition_ask_no_cpus_per_task(tmp_path):
    """8 GPU ranks whose partition's cores are unknown: no --cpus-per-task=1 (each rank bound to
    one core); the site's DefCpuPerGPU applies and the script's header says so. CPU ranks and a
    value given keep theirs."""
    cfg = _cfg("cluster=slurm", f"runs_root={tmp_path}", "gpus_per_node=8")
    assert cfg.cluster.cpus_per_task is None
    assert "cpus-per-task" not in flags.sbatch_options(cfg, "x")
    assert not any(a.startswith("--cpus-per-task") for a in flags.srun_args(cfg))
    assert "--cpus-per-task unset" in flags.per_task_text(cfg)
    assert "cluster.cpus_per_task=N" in flags.per_task_text(cfg)
    given = _cfg("cluster=slurm", "gpus_per_node=8", "cluster.cpus_per_task=12")
    assert flags.sbatch_options(given, "x")["cpus-per-task"] == "12"
    cpu = _cfg("cluster=slurm", "gpus_per_node=0")
    assert flags.sbatch_options(cpu, "x")["cpus-per-task"] == "1"


def test_a_plain_runtime_error_under_a_watchdog_frame_is_not_nccls():
    tb = Traceback(1, 0, (0, 0.0, 0, 0), Path("a.err"), 3)
    tb.lines = [
        "Traceback (most recent call last):",
        '  File "/app/slurmtrain/compute/faults/watchdog.py", line 40, in guarded',
        "    with watchdog.armed():",
        "RuntimeError: injected crash at step 12",
    ]
    assert not tb.nccl
    tb.lines[-1] = "torch.distributed.DistBackendError: [Rank 1] ProcessGroupNCCL timeout"
    assert tb.nccl
    tb.lines[-1] = "0: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970"  # srun --label
    assert tb.nccl


def test_the_sample_hint_prompts_with_the_corpus_own_text(tmp_path):
    """'def ' is the stdlib corpus's; a model trained on licence text gets its first words."""
    assert sample_prompt(_cfg()) == "def "
    text = tmp_path / "licence.txt"
    text.write_text("\n  Permission is hereby granted, free of charge\n")
    assert sample_prompt(_cfg("data=text", f"data.path={text}")) == "Permission is hereby "
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "MIT License Copyright (c)"}) + "\n")
    assert sample_prompt(_cfg("data=text", f"data.path={docs}")) == "MIT License Copyright "
    assert sample_prompt(_cfg("data=tokens", "data.path=/x/tokens.bin")) is None


def test_sync_of_a_run_without_a_tracker_says_so(tmp_path, capsys):
    """`sync` on a run that logs to no tracker printed nothing and exited 0: now it says so."""
    from slurmtrain.cli import sync

    run = tmp_path / "runs" / "plain" / "aaaaaaaaaaaa"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: plain\nlogger: {}\n")
    assert sync.main([str(run)]) == 0
    assert "logs to no tracker" in capsys.readouterr().out
