"""Hydra's record of a sweep (runs_root/.sweeps/multirun.yaml) holds no secret's value, dry runs
included (issue 37), and a secret's value given on the command line warns once that `ps` shows it
and how to pass it by name."""

from __future__ import annotations

import stat

from slurmtrain.common import secrets
from tests.conftest import run_cli

HEX40 = "0123456789abcdef" * 2 + "01234567"
WORDS = "plain-words-nobody-guesses-37"  # a secret by its key's name only


def test_redacted_hydra_hides_values_in_the_config_the_overrides_and_the_dirname():
    given = [f"+cluster.env.WANDB_API_KEY={WORDS}", "optim.lr=1e-4,3e-4", "cluster=slurm"]
    data = {
        "hydra": {
            "overrides": {"task": given, "hydra": ["hydra.verbose=false"]},
            "job": {"override_dirname": ",".join(sorted(given)), "name": "__main__"},
            "sweep": {"dir": "${runs_root}/.sweeps"},
        },
        "cluster": {"env": {"WANDB_API_KEY": WORDS, "NCCL_SOCKET_IFNAME": "ib0"}},
        "optim": {"lr": 1e-3},
        "runs_root": "runs",
    }
    out = secrets.redacted_hydra(data)
    assert WORDS not in repr(out)
    assert WORDS in repr(data)  # the caller's copy is left alone
    ref = "${oc.env:WANDB_API_KEY}"
    assert out["cluster"] == {"env": {"WANDB_API_KEY": ref, "NCCL_SOCKET_IFNAME": "ib0"}}
    hydra = out["hydra"]
    assert isinstance(hydra, dict)
    assert hydra["overrides"]["task"] == [f"+cluster.env.WANDB_API_KEY={ref}", *given[1:]]
    assert f"+cluster.env.WANDB_API_KEY={ref}" in hydra["job"]["override_dirname"]
    assert hydra["sweep"] == {"dir": "${runs_root}/.sweeps"} and out["optim"] == {"lr": 1e-3}


def test_given_in_clear_names_values_not_references_or_group_choices():
    args = [
        f"+cluster.env.WANDB_API_KEY={WORDS}",
        "+cluster.env.HF_TOKEN=${oc.env:HF_TOKEN}",  # by name: no value on the command line
        "cluster.secrets=[HF_TOKEN]",
        "cluster=slurm",
        f"+notes={HEX40}",  # a credential-looking value under any key
        "optim.lr=1e-4,3e-4",
        "-m",
    ]
    assert secrets.given_in_clear(args) == ["cluster.env.WANDB_API_KEY", "notes"]


def test_a_sweep_dry_run_records_no_value_and_warns_once(tmp_path):
    env = {"SLURMTRAIN_RUNS_ROOT": str(tmp_path / "runs")}
    sweep = [
        "-m",
        "cluster=local",
        "dry_run=true",
        f"+cluster.env.WANDB_API_KEY={WORDS}",
        "optim.lr=1e-4,3e-4",
    ]
    done = run_cli(sweep, tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    warned = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warned == [
        "slurmtrain: warning: cluster.env.WANDB_API_KEY: a secret's value on the command line is "
        "visible to every user of this machine (ps); pass it by name instead: export "
        "WANDB_API_KEY=... and pass cluster.secrets=[WANDB_API_KEY]"
    ]
    record = tmp_path / "runs" / ".sweeps" / "multirun.yaml"
    text = record.read_text()
    assert WORDS not in text and "WANDB_API_KEY: ${oc.env:WANDB_API_KEY}" in text
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    leaks = [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and WORDS in p.read_text()]
    assert not leaks, leaks


def test_hydras_run_record_when_turned_on_holds_references_only(tmp_path):
    """conf/config.yaml turns Hydra's .hydra/ off; a user's hydra.output_subdir gets it redacted."""
    env = {"SLURMTRAIN_RUNS_ROOT": str(tmp_path / "runs")}
    args = ["cluster=local", "dry_run=true", f"+cluster.env.WANDB_API_KEY={WORDS}"]
    done = run_cli([*args, "hydra.output_subdir=.hydra"], tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.name for p in (tmp_path / ".hydra").iterdir())
    assert files == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    for name in files:
        path = tmp_path / ".hydra" / name
        assert WORDS not in path.read_text() and "${oc.env:WANDB_API_KEY}" in path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
