"""The README's first command, `bash tools/demo.sh`, shows learning: after its run it prints the
model's continuation of `def `, and that reads as Python (keywords, no whitespace soup). About two
minutes on 2 CPU cores: it is the demo."""

from __future__ import annotations

import keyword
import re
import subprocess
import time

from tests.conftest import ROOT, slurmtrain_env

HEADER = "the model's continuation of 'def ':\n"


def _continuation(stdout: str) -> str:
    """The generated text of the demo's closing sample (the prompt `def ` left out)."""
    assert HEADER in stdout, stdout[-3000:]
    sample = stdout.split(HEADER, 1)[1].split("\nsample: python -m slurmtrain.cli sample", 1)[0]
    assert sample.startswith("def "), sample
    return sample[len("def ") :]


def test_the_demo_prints_a_sample_that_reads_as_python(tmp_path):
    start = time.monotonic()
    done = subprocess.run(
        ["bash", "tools/demo.sh"],
        cwd=ROOT,
        env=slurmtrain_env({"SLURMTRAIN_RUNS_ROOT": str(tmp_path / "runs")}),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = _continuation(done.stdout)
    words = re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text)
    keywords = sorted({w for w in words if keyword.iskeyword(w)})  # distinct ones
    longest_spaces = max((len(run) for run in re.findall(r" +", text)), default=0)
    print(f"demo: {seconds:.0f} s with set-up; its sample:\ndef {text}")
    assert len(keywords) >= 3, f"Python keywords in the sample: {keywords}\n{text}"
    assert longest_spaces <= 20, f"a run of {longest_spaces} spaces:\n{text!r}"
    # The advertised commands come after the sample.
    assert done.stdout.index(HEADER) < done.stdout.index("sample: python -m slurmtrain.cli sample")
