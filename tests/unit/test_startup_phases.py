"""Start-up phases: the clock rank 0 keeps (one `startup` row per attempt) and what `report` prints
of it; the resume build that skips the weights' init. The real rows: tests/local."""

from __future__ import annotations

import dataclasses
import time

import pytest
from omegaconf import OmegaConf

from slurmtrain.cli.startup_phases import format_startup
from slurmtrain.common import events
from slurmtrain.compute import resume_build, startup


def test_the_process_start_is_before_now_and_not_long_ago():
    began = startup.process_started_at()
    assert time.time() - 600 < began <= time.time()  # this pytest process, minutes at most


def test_the_clock_records_one_row_with_every_phase_in_order():
    clock = startup.StartupClock(began=time.time() - 1.0)
    clock.mark("launch")
    clock.mark("imports")
    clock.mark("build", build_skipped_init=True)
    rows = []
    clock.finish(rows.append)
    clock.finish(rows.append)  # once only
    [row] = rows
    assert isinstance(row, events.Startup) and row.phases is not None
    assert list(row.phases) == list(startup.PHASES)
    assert row.phases["launch"] >= 0.99 and row.phases["health"] == 0.0
    assert row.seconds is not None and row.seconds >= sum(row.phases.values()) - 0.01
    assert row.build_skipped_init is True
    assert row.torch_from is not None and row.torch_from.endswith("torch/__init__.py")


def test_report_prints_each_attempts_phases():
    rows = [
        events.Started(attempt=1),
        events.Startup(
            attempt=1,
            phases={"launch": 0.5, "imports": 3.0, "build": 1.0, "first_step": 0.4},
            seconds=4.9,
        ),
        events.Startup(
            attempt=2,
            phases={"launch": 0.4, "imports": 2.5, "build": 0.2, "load": 0.3},
            seconds=3.4,
            staged_env="/tmp/slurmtrain-env-k-n1",
            torch_from="/tmp/slurmtrain-env-k-n1/lib/python3.11/site-packages/torch/__init__.py",
        ),
    ]
    text = format_startup(rows)
    lines = text.splitlines()
    assert lines[1].split() == [
        "attempt",
        "launch",
        "imports",
        "build",
        "load",
        "1st",
        "step",
        "total",
    ]
    assert lines[2].split() == ["1", "0.50", "3.00", "1.00", "-", "0.40", "4.90"]
    assert lines[3].split() == ["2", "0.40", "2.50", "0.20", "0.30", "-", "3.40"]
    assert "torch from /tmp/slurmtrain-env-k-n1/" in lines[4]
    assert format_startup([events.Started(attempt=1)]) is None


def _cfg(stage=2, pretrained=None):
    return OmegaConf.create(
        {"deepspeed": {"stage": stage}, "model": {"pretrained_path": pretrained}}
    )


def test_only_a_same_world_zero_0_to_2_resume_skips_the_init():
    assert resume_build.skips_init(_cfg(2), resuming=True, same_world=True)
    assert resume_build.skips_init(_cfg(0), resuming=True, same_world=True)
    assert not resume_build.skips_init(_cfg(2), resuming=False, same_world=True)  # fresh
    assert not resume_build.skips_init(_cfg(2), resuming=True, same_world=False)  # universal
    assert not resume_build.skips_init(_cfg(3), resuming=True, same_world=True)  # zero.Init
    assert not resume_build.skips_init(_cfg(2, "/m"), resuming=True, same_world=True)


def test_a_rank_waiting_for_rank_0s_store_returns_once_it_listens():
    """No fixed back-off: the probe ends within a poll of rank 0's store listening (torch's own
    client retry waited about a second: compute/distributed.py wait_for_store)."""
    import socket
    import threading

    from slurmtrain.compute.distributed import Placement, wait_for_store

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a free port: nothing listens yet
    listening = threading.Event()

    def rank0_store_later() -> None:
        time.sleep(0.5)
        server = socket.create_server(("127.0.0.1", port))
        listening.set()
        server.accept()[0].close()
        server.close()

    threading.Thread(target=rank0_store_later, daemon=True).start()
    where = Placement(1, 1, 2, "127.0.0.1", port, None, "n1")
    waited = wait_for_store(where, timeout_s=120)
    assert listening.is_set() and waited >= 0.5  # it waited for the listener, and no longer
    assert wait_for_store(Placement(0, 0, 2, "127.0.0.1", port, None, "n1"), 120) == 0.0


def test_deepspeeds_optimizer_check_no_longer_compiles_muons_kernels():
    """deepspeed.initialize and the first ZeRO-1/2 step do not import DeepSpeed's Muon (its
    torch.compile at import loads inductor: seconds per rank): under skip_muon_compile the check
    still accepts AdamW, the step's import still resolves, inductor stays unloaded."""
    import subprocess
    import sys

    code = (
        "import os, sys; os.environ['DS_ACCELERATOR'] = 'cpu'\n"
        "import torch, deepspeed\n"
        "from unittest import mock\n"
        "from slurmtrain.compute import deepspeed_compat\n"
        "from deepspeed.runtime.zero import utils\n"
        "deepspeed_compat.skip_muon_compile()\n"
        "opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])\n"
        "with mock.patch.object(utils.dist, 'get_rank', return_value=1):\n"
        "    assert utils.is_zero_supported_optimizer(opt)\n"
        "from deepspeed.runtime.zero.muon.original_muon import muon_update  # each ZeRO-1/2 step\n"
        "print('inductor' if 'torch._inductor.compile_fx' in sys.modules else 'no inductor')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("no inductor")


def test_the_quick_exit_still_flushes_and_runs_atexit_and_skips_the_teardown(tmp_path):
    """`leave` after `arm` (attempt.main): atexit handlers registered after `arm` run, stdio and
    logging are flushed, the code is kept, module teardown (a global's finaliser) is skipped; and
    importing the entrypoint registers no handler but logging's, which `arm` would skip."""
    import subprocess
    import sys

    marker = tmp_path / "atexit"
    code = (
        "import atexit, logging, sys\n"
        "from slurmtrain.compute import quick_exit\n"
        "quick_exit.arm()\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "class Torn:\n"
        "    def __del__(self): print(' torn down')\n"
        "kept = Torn()\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "logging.getLogger().warning('logged')\n"
        "sys.stdout.write('buffered, no newline')\n"
        "quick_exit.leave(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 3 and done.stdout == "buffered, no newline", done
    assert marker.read_text() == "ran" and "logged" in done.stderr
    probe = "import atexit, slurmtrain.compute.attempt; print(atexit._ncallbacks())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "1", done.stderr[-2000:]  # logging's, flushed by `leave`


def test_goodput_counts_start_up_from_the_process_start_the_startup_row_names():
    """rendezvous_done counts from after the imports; the `startup` row's process start is the
    real beginning (interpreter, imports): 10 s more of start-up, taken from queue wait."""
    from slurmtrain.cli.goodput import analyze

    def ev(row, t, attempt):
        return dataclasses.replace(row, time=float(t), attempt=attempt, job_id="1")

    ledger = [
        ev(events.Submitted(), 0, None),
        ev(events.Started(), 100, 1),
        ev(events.RendezvousDone(seconds=5), 100, 1),
        ev(events.Finished(step=10), 200, 1),
    ]
    metrics = [
        {"step": s, "time": 110.0 + 9 * s, "attempt": 1, "step_time": 9.0} for s in range(1, 11)
    ]
    without = analyze(ledger, metrics).goodput
    row = ev(events.Startup(phases={"launch": 15.0}, process_started_at=80.0, seconds=31.0), 111, 1)
    with_row = analyze([*ledger[:3], row, ledger[3]], metrics).goodput
    assert with_row.startup == pytest.approx(without.startup + 15.0)
    assert with_row.queue_wait == pytest.approx(without.queue_wait - 15.0)
