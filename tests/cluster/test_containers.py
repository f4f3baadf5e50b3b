"""A run whose Python exists only in an OCI image: each task a `runc run` under srun.

The image (tools/build_image.sh: Debian 12 + python3 3.11.2 + the wheels + slurmtrain) is built
once per machine and cached; the batch shell's Python is Debian's bare /usr/bin/python3, which
cannot import torch or slurmtrain, so the ranks train inside the image and the supervisor runs
there too (a one-task step). The compute side's provenance shows the image's Python, not .venv's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtrain.common.events import (
    AttemptEnded,
    FailureClass,
    Finished,
    Requeued,
    RestartedInAllocation,
    Signal,
    Started,
)
from tests.cluster.helpers import (
    events,
    node_killed,
    set_time_limit,
    steps_by_attempt,
    submit_run,
    time_limit_soon,
    wait_event,
    wait_until,
)
from tests.conftest import read_jsonl, run_cli

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
BARE_PYTHON = "/usr/bin/python3"  # Debian's: no torch, no slurmtrain


@pytest.fixture(scope="session")
def oci_image(slurm_cluster) -> Path:
    """The cached bundle (built here if CI's background build has not made it yet)."""
    done = subprocess.run(
        ["bash", str(REPO / "tools/build_image.sh")],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = Path(done.stdout.strip().splitlines()[-1])
    assert (bundle / "config.json").is_file()
    return bundle


def _in_image(image: Path) -> list[str]:
    return [
        "cluster=slurm",
        "cluster.container=oci",
        f"cluster.image={image}",
        f"cluster.host_python={BARE_PYTHON}",
        "train.log_interval=1",
        "checkpoint.interval_steps=5",
    ]


def _ranks_ran_the_images_python(run: Path) -> None:
    records = [json.loads(p.read_text()) for p in (run / "provenance").glob("*.json")]
    ranks = [r for r in records if "torch" in r.get("versions", {})]
    assert ranks and all(r["versions"]["torch"].startswith("2.13.0") for r in ranks)
    assert {r["versions"]["python"] for r in ranks} == {"3.11.2"} != {sys.version.split()[0]}
    batch = "".join(p.read_text() for p in (run / "logs").glob("*.batch.out"))
    assert "the supervisor runs inside the image" in batch


def _host_cannot_import(module: str) -> bool:
    probe = subprocess.run([BARE_PYTHON, "-c", f"import {module}"], capture_output=True, cwd="/")
    return probe.returncode != 0


def test_container_run_is_requeued_at_its_time_limit_and_resumes_inside_the_image(
    slurm_cluster, oci_image, workdir
):
    assert _host_cannot_import("torch") and _host_cannot_import("slurmtrain")
    run = submit_run(
        _in_image(oci_image),
        workdir,
        "oci_timelimit",
        ["nodes=1", "cluster.time=3", "cluster.signal_lead_s=30", "train.max_steps=80"],
        inject="step_delay=0.5",
    )
    assert 'bash -c "$oci_task" oci-task python3' in (run / "job.sbatch").read_text()
    assert time_limit_soon(run) == 1
    [requeued] = wait_event(run, Requeued, timeout=400)
    set_time_limit(str(requeued.new_job_id), 3)
    wait_event(run, Finished, timeout=500)
    ev = events(run)
    [sig, *_] = [e for e in ev if isinstance(e, Signal)]
    assert sig.signal == "SIGUSR2"  # Slurm's signal reached the Python inside the container
    assert any(isinstance(e, AttemptEnded) and e.cls == FailureClass.timed_out for e in ev)
    flat = [s for a in sorted(steps_by_attempt(run)) for s in steps_by_attempt(run)[a]]
    assert flat == list(range(1, 81))  # resumed from its checkpoint: no step lost or repeated
    # The ranks ran the image's Python (Debian's 3.11.2 + torch), not this test's interpreter.
    _ranks_ran_the_images_python(run)


def test_node_failure_with_a_spare_restarts_inside_the_container(slurm_cluster, oci_image, workdir):
    run = submit_run(
        _in_image(oci_image),
        workdir,
        "oci_spare",
        ["nodes=2", "faults.spare_nodes=1", "train.max_steps=40", "faults.health_check=false"],
        inject="step_delay=0.5",
    )
    wait_until(
        lambda: (
            (run / "metrics.jsonl").exists()
            and max(r["step"] for r in read_jsonl(run / "metrics.jsonl")) >= 12
        ),
        400,
        "step 12",
    )
    first = [e for e in events(run) if isinstance(e, Started)][0]
    with node_killed(slurm_cluster, first, 1) as victim:  # the batch shell is on rank 0's node
        wait_event(run, Finished, timeout=400, fail_on=())
    ev = events(run)
    started = [e for e in ev if isinstance(e, Started)]
    assert len({e.job_id for e in started}) == 1 and len(started) == 2  # same job, no queue
    assert victim not in started[1].hosts
    [moved] = [e for e in ev if isinstance(e, RestartedInAllocation)]
    assert moved.left_out == (victim,) and moved.reason == FailureClass.node_failure
    assert not any(isinstance(e, Requeued) for e in ev)
    _ranks_ran_the_images_python(run)


def test_an_image_without_python_is_refused_by_the_dry_run_in_one_line(
    slurm_cluster, tmp_path, workdir
):
    broken = tmp_path / "broken"
    (broken / "rootfs/usr/bin").mkdir(parents=True)
    (broken / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    done = run_cli(
        ["cluster=slurm", "cluster.container=oci", f"cluster.image={broken}", "dry_run=true"],
        cwd=workdir,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [ln for ln in done.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, errors
    assert f"cluster.image={broken}: the image has no python3" in errors[0]
    assert "tools/build_image.sh" in errors[0]
    assert not (workdir / "runs").exists() or not any((workdir / "runs").rglob("job.sbatch"))
