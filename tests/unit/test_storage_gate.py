"""The health gate's storage probe and GPU checks, and doctor's rows of them (real directories;
NVML through a stand-in object, as this machine has no NVIDIA device)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtrain.cli.doctor import io_checks
from slurmtrain.common import gpu_health, storage_probe
from slurmtrain.compute.faults import health
from slurmtrain.compute.faults.inject import Injector

REPO = Path(__file__).resolve().parents[2]


def _names(report: storage_probe.MountReport) -> list[tuple[str, bool]]:
    return [(s.name, s.ok) for s in report.steps]


def test_a_usable_directory_passes_every_step_with_figures_and_is_left_as_it_was(tmp_path):
    [report] = storage_probe.probe_mounts([("run dir", tmp_path)], storage_probe.Rates(1, 1))
    assert _names(report) == [(s, True) for s in storage_probe.STEPS]
    assert "MB/s" in report.steps[-1].detail and report.write_mb_per_s > 0
    assert storage_probe.failure([report]) is None
    assert list(tmp_path.iterdir()) == []  # no probe file left behind
    assert report.seconds < 2.0  # the per-node bound (the probe stops writing at 0.6 s)


def test_missing_directory_and_a_file_fail_as_not_present(tmp_path):
    file = tmp_path / "f"
    file.write_text("x")
    reports = storage_probe.probe_mounts([("run dir", tmp_path / "gone"), ("checkpoint dir", file)])
    assert [_names(r) for r in reports] == [[("present", False)]] * 2
    assert [r.steps[0].detail for r in reports] == ["missing", "not a directory"]
    why = storage_probe.failure(reports)
    assert why == f"storage: run dir {tmp_path / 'gone'}: present: missing"


def test_simulated_read_only_fails_at_writable_and_says_so(tmp_path):
    [report] = storage_probe.probe_mounts([("run dir", tmp_path)], read_only=True)
    assert _names(report) == [("present", True), ("writable", False)]
    why = storage_probe.failure([report]) or ""
    assert why.startswith(f"storage: run dir {tmp_path}: writable: cannot create a file: ")
    assert "Read-only file system, simulated" in why


def _unshare_works() -> bool:
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs root and `unshare -m`")
def test_a_real_read_only_bind_mount_fails_and_other_processes_still_write(tmp_path):
    mounts = [("run dir", tmp_path), ("checkpoint dir", tmp_path)]
    reports = storage_probe.probe_read_only_mount(mounts)
    why = storage_probe.failure(reports) or ""
    assert "writable: cannot create a file: Read-only file system (errno 30)" in why
    assert "simulated" not in why
    (tmp_path / "still-writable").write_text("x")  # the mount namespace was the probe's only


def test_a_mount_ten_times_below_the_plan_fails_and_one_without_a_plan_only_reports(tmp_path):
    plan = storage_probe.Rates(write_mb_per_s=1e9, read_mb_per_s=None)
    [slow] = storage_probe.probe_mounts([("run dir", tmp_path)], plan)
    assert slow.failed is not None and slow.failed.name == "throughput"
    assert "write below 1/10 of the plan's 1,000,000,000 MB/s" in slow.failed.detail
    [free] = storage_probe.probe_mounts([("run dir", tmp_path)])
    assert free.failed is None and "(no planned rate to compare)" in free.steps[-1].detail


def test_a_full_disk_is_not_the_nodes_fault(tmp_path):
    """A checkpoint dir with less room than the probe (a full filesystem, a quota) passes the gate
    untimed: every node shares it, and the saves report a full disk (tests/local/test_disk_full)."""
    small = tmp_path / "small"
    small.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3M,mode=0700", "tmpfs", str(small)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        [full] = storage_probe.probe_mounts([("checkpoint dir", small)])
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert full.failed is None, full.failed
    assert "MiB free (a full disk or quota is not this node's fault" in full.steps[-1].detail


def test_a_second_mount_on_the_same_filesystem_is_not_timed_again(tmp_path):
    (tmp_path / "ck").mkdir()
    a, b = storage_probe.probe_mounts([("run dir", tmp_path), ("checkpoint dir", tmp_path / "ck")])
    assert len(a.steps) == 5 and _names(b) == [
        ("present", True),
        ("writable", True),
        ("fsync", True),
    ]


def test_the_gate_runs_node_checks_on_the_node_lead_only_and_names_the_storage_failure(tmp_path):
    checks = health.node_checks(
        tmp_path, _cfg("faults.io_read_mb_per_s=0", "gpus_per_node=0"), read_only=False
    )
    assert checks.mounts == (("run dir", tmp_path), ("checkpoint dir", tmp_path / "checkpoints"))
    bad = health.NodeChecks((("run dir", tmp_path / "gone"),))
    assert health._lead_checks(bad, "n1", 1, ["n1", "n1"]) == (True, "", 0.0)  # rank 1: not lead
    ok, why, seconds = health._lead_checks(bad, "n1", 0, ["n1", "n1"])
    assert not ok and why == f"storage: run dir {tmp_path / 'gone'}: present: missing"
    failing = health.RankHealth("n1", 0, False, why, 0.0, 0.0, node_check_s=seconds)
    fine = health.RankHealth("n2", 1, True, "", 0.01, 0.0)
    verdict = health.judge([failing, fine], slow_factor=5.0)
    assert verdict.bad == [{"node": "n1", "rank": 0, "reason": why}]


def _cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    from slurmtrain.common import schema

    schema.register()
    with initialize_config_dir(config_dir=schema.conf_dir(), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_a_local_runs_one_machine_is_not_failed_for_missing_a_cluster_filesystems_rate(tmp_path):
    """The README's local run died at its gate on a busy CI host: read 154 MB/s, below 1/10 of the
    default 2,000 MB/s (a parallel filesystem's figure). Failing the only machine a local run has
    makes nothing faster; on a cluster the same figures still fail the node."""
    fast = ("faults.io_write_mb_per_s=1e9", "faults.io_read_mb_per_s=1e9", "gpus_per_node=0")
    (tmp_path / "checkpoints").mkdir()
    local = health.node_checks(tmp_path, _cfg("cluster=local", *fast), read_only=False)
    ok, why = local.run("n1")
    assert ok and why == "" and local.plan == storage_probe.Rates()
    slurm = health.node_checks(tmp_path, _cfg("cluster=slurm", *fast), read_only=False)
    ok, why = slurm.run("n1")
    assert not ok and "of the plan's 1,000,000,000 MB/s" in why
    gone = health.node_checks(tmp_path / "gone", _cfg("cluster=local", *fast), read_only=False)
    assert gone.run("n1") == (False, f"storage: run dir {tmp_path / 'gone'}: present: missing")


def test_bad_storage_node_injection_names_its_node():
    env = {"SLURMTRAIN_INJECT": "bad_storage_node=n2"}
    injector = Injector(0, env, allowed=True)
    assert injector.fails_storage("n2") and not injector.fails_storage("n1")
    assert not injector.fails_health("n2")
    assert not Injector(0, env, allowed=False).fails_storage("n2")


class FakeNvml:
    """pynvml's names this module calls; `states` per device index, None: NotSupported."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0

    def __init__(self, *devices: dict[str, object]) -> None:
        self.devices = devices

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, object]:
        return self.devices[i]

    def _get(self, h: dict[str, object], key: str) -> object:
        if key not in h:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return h[key]

    def nvmlDeviceGetTotalEccErrors(self, h: dict[str, object], kind: int, counter: int) -> object:
        return self._get(h, "ecc")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: dict[str, object]) -> object:
        return self._get(h, "pending")

    def nvmlDeviceGetRemappedRows(self, h: dict[str, object]) -> object:
        return self._get(h, "remap")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: dict[str, object]) -> object:
        return self._get(h, "throttle")


HEALTHY = {"ecc": 0, "pending": 0, "remap": (0, 0, 0, 0), "throttle": 0x1 | 0x4}  # idle, power cap


@pytest.mark.parametrize(
    "device, reason",
    [
        (HEALTHY, ""),
        ({}, ""),  # nothing supported: nothing judged
        ({**HEALTHY, "ecc": 3}, "ecc: GPU 1 has 3 uncorrectable ECC errors (volatile)"),
        ({**HEALTHY, "pending": 1}, "ecc: GPU 1 has retired pages pending (reset the GPU)"),
        (
            {**HEALTHY, "remap": (0, 2, 1, 0)},
            "ecc: GPU 1 has remapped rows pending (reset the GPU)",
        ),
        ({**HEALTHY, "remap": (0, 2, 0, 1)}, "ecc: GPU 1 row remapping failed (replace the GPU)"),
        (
            {**HEALTHY, "throttle": 0x8 | 0x40},
            "throttle: GPU 1 clocks slowed by hw_slowdown+hw_thermal",
        ),
    ],
)
def test_nvml_findings_fail_the_device_they_are_on(device, reason):
    report = gpu_health.check(FakeNvml(HEALTHY, device), log="")
    assert (report.ok, report.reason) == (not reason, reason)
    assert report.note.startswith("2 NVIDIA device(s)")


def test_hardware_xids_in_the_kernel_log_fail_and_program_xids_do_not():
    log = (
        "[ 10.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception\n"
        "[ 99.0] NVRM: Xid (PCI:0000:86:00): 79, pid=2, GPU has fallen off the bus.\n"
    )
    assert gpu_health.xids(log) == [("0000:86:00", 79)]
    report = gpu_health.check(FakeNvml(HEALTHY), log=log)
    assert report.reason == "xid: 79 (fell off the bus) on PCI 0000:86:00"
    assert gpu_health.check(FakeNvml(HEALTHY), log=log.splitlines()[0]).ok


def test_only_recent_xids_count_the_kernel_log_holds_everything_since_boot():
    day = gpu_health.XID_RECENT_S
    log = (
        "[ 100.5] NVRM: Xid (PCI:0000:86:00): 79, pid=2, GPU has fallen off the bus.\n"
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=3, DBE (no dmesg stamp: its age is unknown)\n"
    )
    assert gpu_health.xids(log, uptime=100.5 + day + 60) == [("0000:3b:00", 48)]
    assert gpu_health.xids(log, uptime=200.0) == [("0000:86:00", 79), ("0000:3b:00", 48)]
    assert gpu_health.xids(log.splitlines()[0], uptime=100.5 + day + 60) == []


def test_the_real_nvml_path_runs_here_and_reports_no_device():
    report = gpu_health.check()
    assert report.ok and report.note.startswith("no NVIDIA device")


def test_doctor_rows_one_per_check_with_figures(tmp_path):
    rows = io_checks.io_checks(tmp_path / "runs", tmp_path / "gone", 1, 1)
    assert [r.name for r in rows] == list(io_checks.NAMES[:-1])
    by = {r.name: r for r in rows}
    assert by["io_present"].status == "fail" and "checkpoint dir" in by["io_present"].value
    assert f"runs root's nearest parent {tmp_path}: a directory" in by["io_present"].value
    assert "ms" in by["io_fsync"].value and "MB/s" in by["io_throughput"].value
    assert by["io_throughput"].value.endswith(" s)")  # the probe's cost
    assert io_checks.gpu_check().value.startswith("no NVIDIA device")


@pytest.mark.skipif(not _unshare_works(), reason="needs root and `unshare -m`")
def test_doctor_on_a_read_only_runs_root_reports_it_as_the_gate_does(tmp_path):
    code = (
        "from pathlib import Path; from slurmtrain.cli.doctor import io_checks;"
        f"[print(r.status, r.name, r.value) for r in io_checks.io_checks(Path({str(tmp_path)!r}),"
        " None, 1000, 2000)]"
    )
    script = f'mount --bind "{tmp_path}" "{tmp_path}" && mount -o remount,ro,bind "{tmp_path}"'
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{script} && exec "$@"', "sh"]
        + [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert lines[1] == (
        f"fail io_writable runs root {tmp_path}: cannot create a file: Read-only file system "
        "(errno 30)"
    ), done.stdout + done.stderr


def test_storage_slow_on_every_node_blames_none_and_slow_on_one_blames_it():
    slow = "storage: run dir /r: throughput: 16 MiB: write 9 MB/s; write below 1/10 of the plan's 1,000 MB/s"

    def node(name: str, rank: int, why: str) -> health.RankHealth:
        return health.RankHealth(name, rank, not why, why, 0.01, 0.0)

    everywhere = [node("n1", 0, slow), node("n2", 1, slow)]
    assert health.judge(everywhere, slow_factor=5.0).bad == []
    one = [node("n1", 0, slow), node("n2", 1, "")]
    assert health.judge(one, slow_factor=5.0).bad == [{"node": "n1", "rank": 0, "reason": slow}]
    read_only = "storage: run dir /r: writable: cannot create a file: Read-only file system"
    both = [node("n1", 0, read_only), node("n2", 1, read_only)]
    assert [b["node"] for b in health.judge(both, slow_factor=5.0).bad] == ["n1", "n2"]
