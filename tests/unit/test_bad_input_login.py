"""Bad input that would reach the queue or print a traceback is refused at the login node with one
line naming the key, the value and the fix; exit 2; no run directory made."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

CASES = [
    # Hydra's `+` adds a key even to a struct config: every worker then died with ConfigKeyError.
    (["cluster=local", "+some_new_key=1"], "some_new_key"),
    (["cluster=local", "++train.no_such=2"], "train.no_such"),
    (["cluster=local", "+model.nme=x"], "model.nme='x'"),  # a section the group fills in
    (["cluster=local", "runs_root=/proc/nope"], "runs_root='/proc/nope'"),
    # Keys the chosen kind does not use are still checked: the run may be moved to Slurm later.
    (["cluster=local", "cluster.time=abc"], "cluster.time='abc'"),
    (["cluster=local", "cluster.partition=a;b"], "cluster.partition"),
    (["cluster=local", "+cluster.env.1BAD=x"], "cluster.env.1BAD"),
    # ${X} is Hydra's interpolation: the line says how to write the shell's (issue 35)
    (["cluster=local", "+cluster.env.A=${SLURM_JOB_ID}"], "'+cluster.env.A=\\${SLURM_JOB_ID}'"),
    (["cluster=local", "cluster.secrets=[NOT_SET_HERE_X]"], "cluster.secrets: NOT_SET_HERE_X"),
    (["cluster=local", "+cluster.sbatch_extra.requeue=false"], "cluster.sbatch_extra.requeue"),
    (["cluster=local", "run_dir_mode=0777"], "run_dir_mode='0777'"),
    # DeepSpeed saves its config into every checkpoint: a key there would be stored in clear.
    (["cluster=local", "+deepspeed.extra.comet.api_key=x"], "+cluster.env.COMET_API_KEY"),
]


@pytest.mark.parametrize("args,named", CASES, ids=[c[0][-1] for c in CASES])
def test_refused_at_login_in_one_line(args, named, workdir):
    for extra in ([], ["dry_run=true"]):
        done = run_cli(args + extra, cwd=workdir, env={"SLURMTRAIN_RUNS_ROOT": "runs"})
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert named in lines[0] and "Traceback" not in lines[0], lines[0]
        assert not (workdir / "runs").exists()
