"""Bad input: one line naming the key, the value and the fix; exit 2; nothing started."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

CASES = [
    (["model=opt_huge"], "model=opt_huge"),
    (["nodes=abc"], "nodes='abc'"),
    (["nodes=0"], "nodes=0"),
    (["nodes=1.5"], "nodes=1.5"),
    (["train.global_batch_size=7"], "train.global_batch_size=7"),
    (["no_such_key=1"], "no_such_key"),
    (["data=tokens", "data.path=/nonexistent/tokens.bin"], "data.path='/nonexistent/tokens.bin'"),
    (["train.max_steps=lots"], "train.max_steps='lots'"),
    (["resume=latest"], "resume='latest'"),
    (["faults.spike_factor=0.5"], "faults.spike_factor=0.5"),
]


@pytest.mark.parametrize("args,named", CASES, ids=[c[0][-1] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(args, named, workdir):
    done = run_cli(args, cwd=workdir)
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert named in lines[0] and "Traceback" not in lines[0]
    assert not (workdir / "runs").exists()
