"""Bad data/validation settings: one line naming key, value and fix, exit 2, nothing started."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_cli


def _bin(path, n: int) -> str:
    np.arange(n, dtype=np.uint16).tofile(path)
    path.with_suffix(".json").write_text(
        json.dumps({"dtype": "uint16", "tokens": n, "vocab_size": 256})
    )
    return str(path)


def _cases(tmp):
    small = _bin(tmp / "small.bin", 3000)
    ok = _bin(tmp / "ok.bin", 100_000)
    return [
        (["data.valid_fraction=0.7"], "data.valid_fraction=0.7"),
        (["data.valid_windows=0"], "data.valid_windows=0"),
        (["train.eval_interval=-1"], "train.eval_interval=-1"),
        (["data=blend"], "data.sources=[]"),
        (
            ["data=blend", "data.sources=[{path:/nonexistent.bin,weight:1}]"],
            "data.sources[0].path='/nonexistent.bin'",
        ),
        (["data=blend", f"data.sources=[{{path:{ok},weight:0}}]"], "data.sources[0].weight=0"),
        (["data=tokens", f"data.path={small}", "data.seq_len=128"], "data.valid_fraction=0.01"),
        (["data.valid_path=/nonexistent/v.bin"], "data.valid_path='/nonexistent/v.bin'"),
    ]


@pytest.mark.parametrize("index", range(8))
def test_bad_data_settings_are_one_line_exit_2(index, workdir):
    args, named = _cases(workdir)[index]
    done = run_cli(args + ["dry_run=true"], cwd=workdir)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], lines


def test_a_blend_with_spaces_as_the_issue_writes_it_plans(workdir):
    a, b = _bin(workdir / "a.bin", 100_000), _bin(workdir / "b.bin", 100_000)
    sources = f"data.sources=[{{path: {a}, weight: 0.7}}, {{path: {b}, weight: 0.3}}]"
    done = run_cli(["data=blend", sources, "data.seq_len=64", "dry_run=true"], cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
