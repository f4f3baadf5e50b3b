"""Secrets: cluster.env values and secret-named keys are written as references,
never values; the batch script sources a 0600 file instead; token-looking strings are redacted."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from hydra import compose, initialize_config_module

from slurmtrain.common import schema

HEX40 = "0123456789abcdef0123456789abcdef01234567"
TOKENS = [
    HEX40,
    "hf_" + "A" * 34,
    "ghp_" + "b" * 36,
    "github_pat_11ABCDEFG0" + "x" * 50,
    "sk-proj-" + "c" * 40,
    "xoxb-1234-5678-abcdefghij",
    "AKIAIOSFODNN7EXAMPLE",
    "f" * 32,
    "e" * 64,
]


def test_redact_text_covers_common_tokens():
    from slurmtrain.common.secrets import redact_text

    for token in TOKENS:
        assert token not in redact_text(f"x={token} y"), token
    assert redact_text("git sha 3a732a1 step_1000 lr=3e-4") == "git sha 3a732a1 step_1000 lr=3e-4"


def test_argv_and_overrides_lose_secret_values():
    from slurmtrain.common.secrets import redact_overrides

    args = [
        f"cluster.env.WANDB_API_KEY={HEX40}",
        "+cluster.env.MY_VAR=plain",
        "deepspeed.extra.comet.api_key=hunter2",
        "train.tokens=3e11",
    ]
    out = redact_overrides(args)
    assert not any(HEX40 in a or "hunter2" in a for a in out), out
    assert out[0] == "cluster.env.WANDB_API_KEY=${oc.env:WANDB_API_KEY}"
    assert out[3] == "train.tokens=3e11"
    assert redact_overrides(["cluster.env={A: hunter2}"]) == ["cluster.env=<redacted>"]


def test_group_choices_are_recorded_as_given():
    """#36: `cluster=slurm` chooses a config file by name: overrides.yaml holds it as given (it
    recorded `cluster=<redacted>`); a dict given whole, or a token, is still hidden."""
    from slurmtrain.common.secrets import redact_overrides

    given = ["cluster=slurm", "model=opt13b", "+site=pyxis_efa", "logger=[tensorboard,wandb]"]
    assert redact_overrides(given) == given
    assert redact_overrides(["cluster={partition: gpu, token: x}"]) == ["cluster=<redacted>"]
    assert HEX40 not in " ".join(redact_overrides([f"cluster={HEX40}"]))
    assert redact_overrides(["cluster.password=hunter2"]) == [
        "cluster.password=${oc.env:SLURMTRAIN_SECRET_CLUSTER_PASSWORD}"
    ]


def _cfg(tmp_path, *overrides):
    schema.register()
    with initialize_config_module("slurmtrain.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "cluster=slurm",
                "cluster.partition=debug",
                f"runs_root={tmp_path}",
                *overrides,
            ],
        )
    from slurmtrain.login.prepare import resolve

    return resolve(cfg)


def test_sbatch_sources_a_0600_file_and_config_holds_references(tmp_path):
    from slurmtrain.common import rundir, secrets
    from slurmtrain.login.slurm_submit import render_sbatch

    cfg = _cfg(
        tmp_path,
        f"+cluster.env.WANDB_API_KEY={HEX40}",
        "+cluster.env.NCCL_SOCKET_IFNAME=ib0",
    )
    run = rundir.locate(cfg)
    old = os.umask(0)  # umask-proof: the modes do not come from the caller's umask
    try:
        data = secrets.referenced(cfg)
        rundir.create(run, cfg, [], data=data)
        secrets.write_env_file(run.path, cfg)
    finally:
        os.umask(old)
    script = render_sbatch(cfg, run)
    text = run.config.read_text()
    assert HEX40 not in script and HEX40 not in text
    # cluster.env is configuration (issue 35): NCCL_SOCKET_IFNAME in job.sbatch, not secrets.env
    assert "ib0" not in (run.path / "secrets.env").read_text()
    assert 'export NCCL_SOCKET_IFNAME="ib0"' in script and "ib0" in text
    assert f". {run.path}/secrets.env" in script
    assert "${oc.env:WANDB_API_KEY" in text
    env_file = run.path / "secrets.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert HEX40 in env_file.read_text()
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700  # run_dir_mode default (issue 37)
    assert stat.S_IMODE(run.config.stat().st_mode) & 0o007 == 0
    # The compute node resolves the references from the environment the script sourced.
    os.environ["WANDB_API_KEY"] = HEX40
    loaded = schema.load_run_config(str(run.config))
    assert loaded.cluster.env["WANDB_API_KEY"] == HEX40  # a plain dict in the typed config


def test_a_secret_named_key_anywhere_is_a_reference_resolved_from_the_environment(monkeypatch):
    from omegaconf import OmegaConf

    from slurmtrain.common import secrets

    data = {"observe": {"wandb_api_key": "hunter2", "tokens": 7}, "cluster": {"env": {}}}
    name = secrets.env_name("observe.wandb_api_key")
    assert secrets.values(data) == {name: "hunter2"}
    recorded = secrets.referenced(data)
    assert recorded["observe"] == {"wandb_api_key": "${oc.env:" + name + "}", "tokens": 7}
    monkeypatch.setenv(name, "hunter2")
    assert OmegaConf.create(recorded).observe.wandb_api_key == "hunter2"


def test_error_lines_and_sweep_points_do_not_echo_a_secret(tmp_path):
    from tests.conftest import run_cli

    env = {"SLURMTRAIN_RUNS_ROOT": str(tmp_path / "runs")}
    typo = run_cli(["cluster=local", f"+cluster.evn.WANDB_API_KEY={HEX40}"], tmp_path, env)
    assert typo.returncode == 2 and "cluster.evn: not a slurmtrain setting" in typo.stderr
    sweep = [
        "-m",
        "cluster=local",
        "dry_run=true",
        f"+cluster.env.WANDB_API_KEY={HEX40}",
        "optim.lr=1e-4,3e-4",
    ]
    points = run_cli(sweep, tmp_path, env)
    assert points.returncode == 0 and points.stdout.count("\npoint ") == 1, points.stderr
    for done in (typo, points):
        assert HEX40 not in done.stdout + done.stderr
    [folder] = re.findall(r" under\s+(\S+)", points.stdout)
    for written in Path(folder).rglob("*.*"):
        assert HEX40 not in written.read_text(), written  # the dry run's config files


def test_array_script_sources_each_points_file_if_it_has_one(tmp_path):
    from slurmtrain.login import flags
    from slurmtrain.login.slurm_submit import job_name, render_script

    cfg = _cfg(tmp_path, f"+cluster.env.WANDB_API_KEY={HEX40}")
    options = flags.sbatch_options(cfg, job_name(cfg))
    script = render_script(cfg, "", options, "x/%A_%a.batch.out", array_map=str(tmp_path / "m"))
    assert '[ ! -e "$RUN_DIR"/secrets.env ] || . "$RUN_DIR"/secrets.env || {' in script
    assert HEX40 not in script


def test_model_keys_are_never_secrets_and_token_ids_are_fingerprinted(tmp_path):
    """Issue 33: hf_extra's bos/eos/pad_token_id were taken for credentials (`${oc.env:...}` in
    config.yaml, strings on the compute side, one fingerprint for two models)."""
    import json

    from slurmtrain.common import rundir, secrets

    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128}
    llama.update(num_hidden_layers=2, num_attention_heads=4, vocab_size=512)
    prints, texts = set(), []
    for bos in (1, 7):
        folder = tmp_path / f"bos{bos}"
        folder.mkdir()
        body = {**llama, "bos_token_id": bos, "eos_token_id": 2, "pad_token_id": 0}
        (folder / "config.json").write_text(json.dumps(body))
        cfg = _cfg(tmp_path, "model=hf", f"model.config={folder}", "data.seq_len=64")
        data = secrets.referenced(schema.plain(cfg))  # what config.yaml records (login/prepare.py)
        assert secrets.values(cfg) == {}
        prints.add(rundir.fingerprint(cfg, data))
        texts.append(rundir.config_yaml(cfg, data))
    assert len(prints) == 2
    for text in texts:
        assert "oc.env" not in text and "SLURMTRAIN_SECRET" not in text, text
    assert "bos_token_id: 7" in texts[1] and "pad_token_id: 0" in texts[1]
    assert secrets.redact_overrides(["model.hf_extra.pad_token_id=0"]) == [
        "model.hf_extra.pad_token_id=0"
    ]
    assert secrets.is_secret_key("deepspeed.extra.comet.api_key")  # elsewhere: still a secret
