"""cluster=slurm against the real local cluster: multi-node DeepSpeed, arrays, hand resubmission,
validation against partitions, hostile values."""

from __future__ import annotations

import json
import subprocess

import pytest

from slurmtrain.common.events import CheckpointLoaded, Failed, Finished, Started, Submitted, parse
from slurmtrain.common.rundir import RunDir, read_jsonl
from tests.cluster.helpers import events, only_run, wait_event, wait_job_gone
from tests.conftest import dry_run_file, run_cli

pytestmark = pytest.mark.slurm
SHORT = [
    "cluster=slurm",
    "train.max_steps=20",
    "train.log_interval=5",
    "checkpoint.interval_steps=10",
]


def _submit(args, workdir):
    done = run_cli(SHORT + args, cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted job" in done.stdout
    return done


@pytest.mark.parametrize("nodes,stage", [(2, 2), (4, 3)])
def test_multi_node_job_trains_to_the_end(slurm_cluster, workdir, nodes, stage):
    name = f"n{nodes}z{stage}"
    _submit([f"nodes={nodes}", f"deepspeed=zero{stage}", f"name={name}"], workdir)
    run = only_run(workdir / "runs", name)
    [finished] = wait_event(run, Finished, timeout=400)
    [started] = [e for e in events(run) if isinstance(e, Started)]
    [submitted] = [e for e in events(run) if isinstance(e, Submitted)]
    assert started.job_id == submitted.job_id
    assert len(set(started.hosts)) == nodes and set(started.hosts) <= set(slurm_cluster.nodes)
    assert finished.step == 20 and not any(isinstance(e, Failed) for e in events(run))
    wait_job_gone(submitted.job_id)
    logs = sorted(p.name for p in (run / "logs").glob(f"{submitted.job_id}_*.out"))
    assert len(logs) == nodes, logs  # one log file per rank
    assert "step 20/20" in (run / "logs" / logs[0].replace(".out", ".err")).read_text()


def test_sweep_is_one_array_that_returns_at_once_and_is_not_resubmitted(slurm_cluster, workdir):
    done = run_cli(["-m"] + SHORT + ["optim.lr=1e-4,3e-4,1e-3", "name=sweep3"], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(p.parent for p in (workdir / "runs" / "sweep3").glob("*/config.yaml"))
    assert len(runs) == 3
    ids = [[e for e in events(r) if isinstance(e, Submitted)][0].job_id for r in runs]
    assert len({i.split("_")[0] for i in ids}) == 1 and all("_" in i for i in ids)  # one array
    assert not any(isinstance(e, Finished) for r in runs for e in events(r))  # did not wait
    for run in runs:
        wait_event(run, Finished, timeout=400)
    again = run_cli(["-m"] + SHORT + ["optim.lr=1e-4,3e-4,1e-3", "name=sweep3"], cwd=workdir)
    assert again.returncode == 0 and "nothing submitted" in again.stdout
    assert all(sum(isinstance(e, Submitted) for e in events(r)) == 1 for r in runs)


def test_job_sbatch_resubmitted_by_hand_resumes_from_newest_checkpoint(slurm_cluster, workdir):
    _submit(["nodes=2", "name=byhand", "train.max_steps=40"], workdir)
    run = only_run(workdir / "runs", "byhand")
    wait_event(run, Finished, timeout=400)
    # The first job's batch shell is still running its supervisor after `finished`: editing the
    # ledger under it would make it read an unfinished run. A hand resubmission comes after the job.
    [first] = [e for e in events(run) if isinstance(e, Submitted)]
    wait_job_gone(first.job_id)
    # Continue the same run further by hand: raise max_steps in the recorded config is not allowed
    # (it would change the experiment), so instead drop the last checkpoint's "finished" marker by
    # resubmitting a copy of the run whose ledger stops before the end.
    for path in RunDir(run).ledger_files():  # every writer's file of the ledger
        ledger = read_jsonl(path)
        path.write_text(
            "".join(
                __import__("json").dumps(e) + "\n"
                for e in ledger
                if not isinstance(parse(e), Finished)
            )
        )
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_40")
    (run / "checkpoints" / "latest").write_text("step_30")
    out = subprocess.run(
        ["sbatch", "--parsable", str(run / "job.sbatch")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    finished = wait_event(run, Finished, timeout=400)
    loaded = [e for e in events(run) if isinstance(e, CheckpointLoaded)]
    assert loaded[-1].step == 30 and loaded[-1].job_id == out.split(";")[0]
    assert finished[-1].step == 40


@pytest.mark.parametrize(
    "args,named",
    [
        (["cluster.partition=nosuch"], "cluster.partition"),
        (["nodes=9"], "nodes"),
        (["cluster.time=3:00:00"], "cluster.time"),
        (["gpus_per_node=1", "force=true"], "gpus_per_node"),
    ],
)
def test_requests_the_cluster_cannot_take_are_refused_before_queueing(
    slurm_cluster, workdir, args, named
):
    done = run_cli(SHORT + args + ["name=refused"], cwd=workdir)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines
    assert not list((workdir / "runs").glob("refused/*/ledger.jsonl"))
    assert not list((workdir / "runs").glob("refused/*/ledger.d/*"))


def test_hostile_values_never_execute(slurm_cluster, workdir, tmp_path):
    canary = tmp_path / "pwned"
    bad_name = run_cli(SHORT + ["name=x; touch " + str(canary)], cwd=workdir)
    assert bad_name.returncode == 2 and "name=" in bad_name.stderr
    quoted_name = run_cli(SHORT + [f"name='x; touch {canary}'"], cwd=workdir)
    assert quoted_name.returncode == 2 and "name='x; touch" in quoted_name.stderr
    newline = run_cli(SHORT + ["cluster.partition=debug\nhostname"], cwd=workdir)
    assert newline.returncode == 2 and "cluster.partition" in newline.stderr
    # A value that reaches the script body is quoted: the job sees the literal text, and only
    # $VAR / ${VAR} expand, on the compute node at job time (issue 35: cluster.env is config).
    env = [
        f"+cluster.env.CANARY='$(touch {canary}); `touch {canary}`'",
        "+cluster.env.SLURMTRAIN_T_JOB=job-$SLURM_JOB_ID",
        "+cluster.env.OMP_NUM_THREADS=\\${SLURM_CPUS_PER_TASK}",  # Hydra's escape for ${...}
        "+cluster.env.LD_LIBRARY_PATH=/opt/site/lib:$LD_LIBRARY_PATH",
        "cluster.master_port=29123",  # a fixed rendezvous port (build 3)
        # Two setup lines (build 2): after cluster.env, in the batch shell, seen by the ranks
        'cluster.setup=["export SLURMTRAIN_T_SETUP=one-$SLURM_JOB_ID",'
        '"export SLURMTRAIN_T_TWO=$SLURMTRAIN_T_JOB/two"]',
    ]
    dry = run_cli(SHORT + ["name=quoted", "train.max_steps=5", *env, "dry_run=true"], workdir)
    dry_script = dry_run_file(dry.stdout, "script").read_text()
    assert dry.returncode == 0 and 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK}"' in dry_script
    _submit(["name=quoted", "train.max_steps=5", *env], workdir)
    run = only_run(workdir / "runs", "quoted")
    wait_event(run, Finished, timeout=400)
    script = (run / "job.sbatch").read_text()
    assert f'export CANARY="\\$(touch {canary}); \\`touch {canary}\\`"' in script
    assert 'export SLURMTRAIN_T_JOB="job-$SLURM_JOB_ID"' in script
    assert not (run / "secrets.env").exists()  # nothing secret: configuration only
    assert not canary.exists()
    # The ranks' environment (rank 0's provenance): expanded there, literal where not a variable.
    seen = json.loads((run / "provenance" / "attempt_1.json").read_text())["env"]
    [started] = [e for e in events(run) if isinstance(e, Started)]
    assert seen["SLURMTRAIN_T_JOB"] == f"job-{started.job_id}"
    assert seen["OMP_NUM_THREADS"] == seen["SLURM_CPUS_PER_TASK"] == "1"
    assert seen["LD_LIBRARY_PATH"].startswith("/opt/site/lib:")
    assert seen["MASTER_PORT"] == seen["SLURMTRAIN_MASTER_PORT"] == "29123"
    job = started.job_id
    assert (seen["SLURMTRAIN_T_SETUP"], seen["SLURMTRAIN_T_TWO"]) == (
        f"one-{job}",
        f"job-{job}/two",
    )
    # A hand `sbatch job.sbatch` from a clean shell (`env -i`): the script alone gives the same.
    wait_job_gone(started.job_id)
    sbatch = subprocess.run(["which", "sbatch"], capture_output=True, text=True).stdout.strip()
    by_hand = subprocess.run(
        ["env", "-i", sbatch, "--parsable", str(run / "job.sbatch")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wait_job_gone(by_hand, timeout=300)
    again = json.loads((run / "provenance" / "attempt_2.json").read_text())["env"]
    assert again["SLURMTRAIN_T_JOB"] == f"job-{by_hand}" and again["OMP_NUM_THREADS"] == "1"
    assert again["SLURMTRAIN_T_SETUP"] == f"one-{by_hand}"
    assert again["MASTER_PORT"] == "29123" and again["LD_LIBRARY_PATH"].startswith("/opt/site/lib")
