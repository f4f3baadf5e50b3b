"""The doctor: every check reported on this machine, GLIBC/wheel mismatches named, parsing of Slurm output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from slurmtrain.cli.doctor import CheckResult, check_names
from slurmtrain.cli.doctor.python_env import packaging_problems, version_tuple
from slurmtrain.cli.doctor.results import Cmd
from slurmtrain.cli.doctor.runner import _guarded, parse_srun_output
from slurmtrain.cli.doctor.slurm_checks import (
    accounting_verdict,
    evaluate_partition,
    parse_partitions,
    parse_scontrol_config,
    slurm_advice,
    slurm_seconds,
    summarize_sinfo,
)
from slurmtrain.cli.doctor.storage import check_disk_space, check_run_root
from slurmtrain.cli.doctor.torch_stack import evaluate_probe
from slurmtrain.cli.doctor.wheels import (
    WheelNeed,
    check_glibc,
    evaluate_glibc,
    machine_glibc,
    manylinux_glibc,
    required_glibc,
    wheel_tags,
)

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300  # only so a broken doctor cannot hang the suite; not a timing assertion


def doctor(
    *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run the doctor as a user would, with this venv's python, from the checkout."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (full_env.get("PYTHONPATH"), str(REPO)) if p
    )
    return subprocess.run(
        [*prefix, sys.executable, "-m", "slurmtrain.cli.doctor", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def plant_wheel(site: Path, name: str, tags: list[str], version: str = "1.0") -> Path:
    """A fake installed distribution: name-version.dist-info/{METADATA,WHEEL,RECORD}."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
        + "".join(f"Tag: {t}\n" for t in tags)
    )
    (info / "RECORD").write_text(
        f"{info.name}/METADATA,,\n{info.name}/WHEEL,,\n{info.name}/RECORD,,\n"
    )
    return info


# ---- the whole doctor on this machine -------------------------------------------------------------------


def test_doctor_prints_every_check_and_no_traceback():
    proc = doctor()  # the rich table, as a user sees it
    assert "Traceback" not in proc.stdout + proc.stderr
    for name in check_names():
        assert f" {name} " in proc.stdout, f"check {name!r} missing from:\n{proc.stdout}"
    verdict = "FAILED: fix the rows marked fail" if proc.returncode else "doctor: no failures"
    assert proc.stdout.rstrip().endswith(verdict)


def test_json_has_every_check_and_exit_code_follows_failures():
    proc = doctor("--json")
    doc = json.loads(proc.stdout)
    names = [c["name"] for c in doc["checks"]]
    assert names == check_names()
    assert all(c["status"] in ("ok", "warn", "fail") for c in doc["checks"])
    failed = any(c["status"] == "fail" for c in doc["checks"])
    assert doc["ok"] is (not failed)
    assert proc.returncode == (1 if failed else 0)


def test_check_names_are_the_documented_set():
    assert check_names() == [
        "python",
        "packaging",
        "venv",
        "torch",
        "cuda",
        "nccl",
        "deepspeed",
        "deepspeed_ops",
        "glibc",
        "slurm_tools",
        "slurm_controller",
        "slurm_accounting",
        "partition",
        "container",
        "image",
        "setup",
        "run_root",
        "disk_space",
        "io_present",
        "io_writable",
        "io_fsync",
        "io_metadata",
        "io_throughput",
        "gpu_health",
    ]


def test_run_checks_api_returns_every_check_without_importing_torch(tmp_path):
    code = (
        "import sys; from pathlib import Path; from slurmtrain.cli.doctor import run_checks, DoctorOptions;"
        f"r = run_checks(DoctorOptions(runs_root=Path({str(tmp_path)!r}), command_timeout=3));"
        "print(','.join(c.name for c in r), {c.status for c in r} <= {'ok', 'warn', 'fail'},"
        " 'torch' in sys.modules, 'deepspeed' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.stdout.split() == [",".join(check_names()), "True", "False", "False"], proc.stderr


def _installed() -> set[tuple[str, str]]:
    return {(d.metadata["Name"], d.version) for d in metadata.distributions()}


def _netns_works() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _netns_works(), reason="needs `unshare -n` (root or user namespaces) to cut the network"
)
def test_doctor_runs_without_network_and_changes_nothing(tmp_path):
    runs_root = tmp_path / "runs_not_created"
    before = _installed()
    proc = doctor(
        "--plain", "--timeout", "3", "--runs-root", str(runs_root), prefix=("unshare", "-n")
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    for name in check_names():
        assert f"] {name} " in proc.stdout
    assert _installed() == before  # nothing installed, upgraded or removed
    assert not runs_root.exists()  # the run root is checked, not created
    assert list(tmp_path.iterdir()) == []  # the write probe cleaned up after itself


# ---- GLIBC against installed wheels ---------------------------------------------------------------------


def test_planted_wheel_needing_newer_glibc_fails_and_is_named(tmp_path):
    machine = machine_glibc()
    if machine is None or machine >= (2, 99):
        pytest.skip("needs a glibc machine older than 2.99")
    plant_wheel(tmp_path, "fakepkg", ["cp311-cp311-manylinux_2_99_x86_64"])
    plant_wheel(tmp_path, "oldpkg", ["cp311-cp311-manylinux2014_x86_64"])
    result = check_glibc([str(tmp_path)])
    assert result.status == "fail"
    assert "fakepkg 1.0 needs 2.99" in result.value
    assert "oldpkg" not in result.value
    assert "do not upgrade GLIBC" in result.advice and "fakepkg" in result.advice


def test_doctor_fails_on_planted_wheel_via_pythonpath(tmp_path):
    if (machine_glibc() or (2, 99)) >= (2, 99):
        pytest.skip("needs a glibc machine older than 2.99")
    plant_wheel(tmp_path, "fakepkg", ["cp311-cp311-manylinux_2_99_x86_64"])
    proc = doctor("--json", env={"PYTHONPATH": str(tmp_path)})
    glibc = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "glibc")
    assert glibc["status"] == "fail" and "fakepkg" in glibc["value"]
    assert proc.returncode == 1


def test_installed_wheels_on_this_machine_fit_its_glibc():
    result = check_glibc()
    assert result.status == "ok", result
    assert result.value.startswith("glibc ")


@pytest.mark.parametrize(
    "tag, need",
    [
        ("manylinux1_x86_64", (2, 5)),
        ("manylinux1_i686", (2, 5)),
        ("manylinux2010_x86_64", (2, 12)),
        ("manylinux2014_aarch64", (2, 17)),
        ("manylinux2014_x86_64", (2, 17)),
        ("manylinux_2_28_x86_64", (2, 28)),
        ("manylinux_2_17_ppc64le", (2, 17)),
        ("manylinux_2_99_x86_64", (2, 99)),
        ("MANYLINUX_2_31_X86_64", (2, 31)),
        ("linux_x86_64", None),
        ("any", None),
        ("musllinux_1_2_x86_64", None),
        ("macosx_11_0_arm64", None),
        ("win_amd64", None),
    ],
)
def test_manylinux_tag_to_glibc(tag, need):
    assert manylinux_glibc(tag) == need


def test_wheel_needs_the_oldest_glibc_among_its_tags():
    # numpy-style: installable on 2.27 even though it also carries a 2.28 tag
    assert required_glibc(
        ["cp311-cp311-manylinux_2_27_x86_64", "cp311-cp311-manylinux_2_28_x86_64"]
    ) == (2, 27)
    assert required_glibc(["cp36-abi3-manylinux_2_12_x86_64.manylinux2010_x86_64"]) == (2, 12)
    assert required_glibc(["py3-none-any"]) is None
    assert (
        required_glibc(["cp311-cp311-linux_x86_64"]) is None
    )  # built locally: no manylinux promise
    assert required_glibc([]) is None


def test_wheel_tags_parses_tag_lines_only():
    text = (
        "Wheel-Version: 1.0\nGenerator: bdist_wheel\nTag: cp311-cp311-manylinux_2_17_x86_64\n"
        "Tag: cp311-cp311-manylinux2014_x86_64\nBuild: 1\n"
    )
    assert wheel_tags(text) == [
        "cp311-cp311-manylinux_2_17_x86_64",
        "cp311-cp311-manylinux2014_x86_64",
    ]


def test_glibc_ok_names_the_wheel_needing_the_newest():
    needs = [WheelNeed("torch", "2.13.0", (2, 28)), WheelNeed("numpy", "2.3", (2, 27))]
    result = evaluate_glibc((2, 36), needs)
    assert result.status == "ok" and "2.28 (torch 2.13.0)" in result.value


def test_glibc_fail_lists_every_too_new_wheel():
    needs = [
        WheelNeed("a", "1", (2, 34)),
        WheelNeed("b", "2", (2, 31)),
        WheelNeed("c", "3", (2, 17)),
    ]
    result = evaluate_glibc((2, 28), needs)
    assert result.status == "fail"
    assert (
        "a 1 needs 2.34" in result.value
        and "b 2 needs 2.31" in result.value
        and "c 3" not in result.value
    )
    assert "install an older wheel of a, b" in result.advice


# ---- packaging ------------------------------------------------------------------------------------------


def test_version_tuple():
    assert version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert version_tuple("70.0.0") == (70, 0, 0)
    assert version_tuple(None) == ()


def test_known_bad_packaging_combinations():
    assert any(
        "pkg_resources.packaging" in p for p in packaging_problems("24.0", "70.0.0", "2.1.2")
    )
    assert any("setuptools 82" in p for p in packaging_problems("24.0", "82.0.0", "2.5.1"))
    assert any("setuptools missing" in p for p in packaging_problems("24.0", None, "2.13.0"))
    assert any("21.3" in p for p in packaging_problems("20.0", "69.0", None))
    assert packaging_problems("26.3", "84.2.1", "2.13.0+cpu") == []


# ---- torch / DeepSpeed probe verdicts (pure) -------------------------------------------------------------

CPU_PROBE = {
    "torch": "2.13.0+cpu",
    "torch_cuda": None,
    "gloo": True,
    "cuda_available": False,
    "deepspeed": "0.19.8",
    "ds_accelerator": "cpu",
    "ds_torch_info": {"version": "0.0"},
    "ninja": True,
    "ds_ops": {
        "cpu_adam": {"compatible": True, "installed": False},
        "async_io": {"compatible": False, "installed": False},
    },
}


def test_probe_cpu_machine_is_ok():
    results = {r.name: r for r in evaluate_probe(CPU_PROBE)}
    assert [r.status for r in results.values()] == ["ok"] * 5
    assert "libaio" in results["deepspeed_ops"].advice


def test_probe_timeout_fails_every_torch_row():
    results = evaluate_probe({"probe_error": "importing torch/deepspeed took longer than 90 s"})
    assert [r.name for r in results] == ["torch", "cuda", "nccl", "deepspeed", "deepspeed_ops"]
    assert all(r.status == "fail" for r in results)


def test_probe_cuda_build_without_gpu_fails_inside_a_job_only():
    probe = dict(CPU_PROBE, torch="2.5.1+cu124", torch_cuda="12.4")
    login = {r.name: r for r in evaluate_probe(probe, driver=None, compute=False)}
    job = {r.name: r for r in evaluate_probe(probe, driver=None, compute=True)}
    assert login["cuda"].status == "ok" and job["cuda"].status == "fail"


def test_probe_cpu_torch_on_gpu_machine_fails():
    cuda = {
        r.name: r
        for r in evaluate_probe(CPU_PROBE, driver="NVRM version: NVIDIA UNIX x86_64 Kernel Module")
    }
    assert cuda["cuda"].status == "fail" and "CUDA wheel" in cuda["cuda"].advice


def test_probe_deepspeed_missing_or_core_op_incompatible():
    no_ds = {
        r.name: r
        for r in evaluate_probe(
            {k: v for k, v in CPU_PROBE.items() if not k.startswith(("ds", "deep"))}
            | {"deepspeed_error": "not installed"}
        )
    }
    assert no_ds["deepspeed"].status == "fail" and no_ds["deepspeed_ops"].status == "fail"
    broken = dict(CPU_PROBE, ds_ops={"cpu_adam": {"compatible": False, "installed": False}})
    ops = {r.name: r for r in evaluate_probe(broken)}["deepspeed_ops"]
    assert ops.status == "warn" and "cpu_adam" in ops.advice


# ---- Slurm output parsing and partition verdicts (pure, on captured 22.05 output) -----------------------

PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL Default=YES GraceTime=20 MaxTime=02:00:00 Nodes=n[1-4] PriorityTier=1 "
    "PreemptMode=REQUEUE State=UP TRES=cpu=8,mem=16000M,node=4,billing=8\n"
    "PartitionName=high AllowGroups=ALL Default=NO GraceTime=0 MaxTime=1-00:00:00 Nodes=n[1-4] PriorityTier=10 "
    "PreemptMode=OFF State=UP TRES=cpu=8,mem=16000M,node=4,billing=8\n"
)
CONFIG = (
    "Configuration data as of 2026-12-02T13:56:00\nKillWait                = 15 sec\n"
    "PreemptMode             = REQUEUE\nPreemptType             = preempt/partition_prio\n"
    "SlurmctldParameters     = (null)\n\nSlurmctld(primary) at vm is UP\n"
)


def test_parse_partitions_and_config():
    parts = parse_partitions(PARTITIONS)
    assert [p["PartitionName"] for p in parts] == ["debug", "high"]
    assert parts[0]["TRES"] == "cpu=8,mem=16000M,node=4,billing=8" and parts[0]["Default"] == "YES"
    conf = parse_scontrol_config(CONFIG)
    assert conf["KillWait"] == "15 sec" and conf["PreemptType"] == "preempt/partition_prio"
    assert "Slurmctld(primary) at vm is UP" not in conf


def test_partition_with_grace_time_gets_sigterm_and_the_grace():
    debug, high = parse_partitions(PARTITIONS)
    conf = parse_scontrol_config(CONFIG)
    result = evaluate_partition(conf, debug)
    assert (
        result.status == "ok"
        and "SIGTERM and 20s to save" in result.advice
        and "--signal=USR2@" in result.advice
    )
    assert "MaxTime=02:00:00" in result.value
    assert "no preemption" in evaluate_partition(conf, high).advice


def test_partition_send_user_signal_and_zero_grace():
    debug, _ = parse_partitions(PARTITIONS)
    conf = parse_scontrol_config(CONFIG)
    new_style = dict(conf, PreemptParameters="send_user_signal")
    old_style = dict(conf, SlurmctldParameters="enable_configless,preempt_send_user_signal")
    for cfg in (new_style, old_style):
        result = evaluate_partition(cfg, debug)
        assert "send_user_signal=yes" in result.value and "your --signal (USR2)" in result.advice
    zero = evaluate_partition(conf, dict(debug, GraceTime="0"))
    assert zero.status == "warn" and "KillWait=15s" in zero.advice
    assert evaluate_partition(conf, dict(debug, State="DOWN")).status == "warn"


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("UNLIMITED", None),
        ("1-00:00:00", 86400),
        ("02:00:00", 7200),
        ("30:00", 1800),
        ("20", 20),
        ("15 sec", 15),
        ("2-12", 216000),
        ("", None),
        ("n/a", None),
    ],
)
def test_slurm_seconds(text, seconds):
    assert slurm_seconds(text) == seconds


def test_summarize_sinfo_counts_down_nodes():
    summary, bad = summarize_sinfo(
        "debug*|up|2:00:00|3|idle\ndebug*|up|2:00:00|1|down*\nhigh|up|1-00:00:00|4|idle\n"
    )
    assert summary == "debug*: up, 4 nodes (1 down*, 3 idle); high: up, 4 nodes (4 idle)"
    assert bad == 1


def test_parse_srun_output_rejoins_split_lines_per_task():
    doc0 = json.dumps(
        {"doctor": 1, "node": "n1", "checks": [{"name": "python", "status": "ok", "value": "3.11"}]}
    )
    doc1 = json.dumps({"doctor": 1, "node": "n2", "checks": []})
    text = f"1: {doc1}\n0: noise before\n0: {doc0[:20]}\n0: {doc0[20:]}\n"
    docs = parse_srun_output(text)
    assert docs[0]["node"] == "n1" and docs[0]["checks"][0]["name"] == "python"
    assert docs[1]["node"] == "n2"
    assert parse_srun_output("srun: error: Unable to allocate resources\n") == {}


# ---- run root -----------------------------------------------------------------------------------------


def test_run_root_is_probed_not_created(tmp_path):
    target = tmp_path / "a" / "b"
    result = check_run_root(target)
    assert result.status == "ok" and "to be created" in result.value
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_run_root_not_shared_with_login_node(tmp_path):
    result = check_run_root(tmp_path, shared_marker=tmp_path / "marker-from-login-node")
    assert result.status == "fail" and "shared" in result.advice


def test_run_root_that_is_a_file_fails(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert check_run_root(f).status == "fail"


def test_disk_space_against_planned_checkpoints(tmp_path):
    assert check_disk_space(tmp_path, None).status == "ok"
    assert check_disk_space(tmp_path, 0.001).status == "ok"
    huge = check_disk_space(tmp_path, 1e12)
    assert huge.status == "fail" and "short by" in huge.advice


def test_result_round_trips_through_json():
    r = CheckResult("glibc", "fail", "v", "a")
    assert CheckResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert CheckResult.from_dict({"name": "x", "status": "weird"}).status == "fail"


@pytest.mark.parametrize(
    "err, rc, advice",
    [
        (
            "sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
            "sinfo: fatal: Could not establish a configuration source",
            1,
            "SLURM_CONF",
        ),
        (
            "sinfo: error: s_p_parse_file: cannot stat file /x/slurm.conf: No such file or directory, retrying",
            124,
            "SLURM_CONF",
        ),
        (
            "slurm_load_partitions: Unable to contact slurm controller (connect failure)",
            1,
            "slurmctld is down",
        ),
        (
            'sinfo: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2"',
            1,
            "munge",
        ),
        ("sinfo: command not found", 127, "not on PATH"),
    ],
)
def test_slurm_failures_get_specific_advice(err, rc, advice):
    assert advice in slurm_advice(Cmd(("sinfo",), rc, "", err, 8.0))


def test_accounting_disabled_is_a_warning_with_fallback_advice():
    disabled = accounting_verdict(
        Cmd(("sacct",), 1, "", "sacct: error: Slurm accounting storage is disabled")
    )
    assert disabled.status == "warn" and "ledger" in disabled.advice
    assert disabled.value == "sacct: error: Slurm accounting storage is disabled"
    no_conf = accounting_verdict(
        Cmd(("sacct",), 1, "", "sacct: fatal: Could not establish a configuration source")
    )
    assert no_conf.status == "warn" and "SLURM_CONF" in no_conf.advice
    assert accounting_verdict(Cmd(("sacct",), 0, "", "")).status == "ok"


def test_a_check_that_raises_becomes_failed_rows():
    def broken() -> list[CheckResult]:
        raise RuntimeError("boom")

    rows = _guarded(("a", "b"), broken)
    assert [(r.name, r.status) for r in rows] == [("a", "fail"), ("b", "fail")]
    assert "RuntimeError: boom" in rows[0].value


def test_setup_lines_run_as_the_batch_script_runs_them() -> None:
    """cluster.setup's lines (doctor --setup LINE): each exit code checked, the failing line named."""
    from slurmtrain.cli.doctor.storage import check_setup

    ok = check_setup(["export A=1", 'test "$A" = 1'], 30)
    assert ok.status == "ok" and "2 line(s)" in ok.value
    bad = check_setup(["true", "ls /nonexistent-slurmtrain-doctor"], 30)
    assert bad.status == "fail" and bad.value.startswith("setup line 2 exited 2")
    assert check_setup([], 30).status == "ok"
