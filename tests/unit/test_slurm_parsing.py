"""Pure Slurm facts: time strings, partitions from captured scontrol text, rendezvous, validation."""

from __future__ import annotations

import pytest

from slurmtrain.common.slurm_text import (
    SlurmError,
    compress_hostlist,
    expand_hostlist,
    format_time,
    master_port,
    parse_kv,
    parse_partitions,
    parse_time,
    rendezvous_from_env,
    tasks_per_node,
    validate_request,
)

# `scontrol show partition -o` on the local cluster, plus a GPU partition from a real cluster.
PARTITIONS_O = """\
PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=20 Hidden=NO MaxNodes=UNLIMITED MaxTime=02:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-4] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=8 TotalNodes=4 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=8,mem=16000M,node=4,billing=8
PartitionName=high AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=1-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-4] PriorityJobFactor=1 PriorityTier=10 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=8 TotalNodes=4 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=8,mem=16000M,node=4,billing=8
PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A DefaultTime=01:00:00 DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=32 MaxTime=2-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=gpu[001-064] PriorityJobFactor=1 PriorityTier=5 RootOnly=NO ReqResv=NO OverSubscribe=EXCLUSIVE OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=6144 TotalNodes=64 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=6144,mem=64000G,node=64,billing=6144,gres/gpu=512,gres/gpu:a100=512
"""

# The same debug partition as plain `scontrol show partition` prints it (several lines).
PARTITION_BLOCK = """\
PartitionName=debug
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=YES QoS=N/A
   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=20 Hidden=NO
   MaxNodes=UNLIMITED MaxTime=02:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=n[1-4]
   PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO
   OverTimeLimit=NONE PreemptMode=REQUEUE
   State=UP TotalCPUs=8 TotalNodes=4 SelectTypeParameters=NONE
   JobDefaults=(null)
   DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
   TRES=cpu=8,mem=16000M,node=4,billing=8

"""


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 1800),
        ("30:15", 1815),
        ("01:02:03", 3723),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:03", 86400 + 7200 + 180),
        ("1-02:03:04", 93784),
        ("90", 5400),
        (" 5 ", 300),
        ("UNLIMITED", None),
        ("infinite", None),
        ("0", None),
        ("0-0:0:0", None),
    ],
)
def test_parse_time_reads_every_slurm_form(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "-5", "1-", "a-01:00", "1.5", "2 days"])
def test_parse_time_rejects_what_slurm_rejects_naming_the_value(text):
    with pytest.raises(ValueError, match="is not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS"):
        parse_time(text)


def test_format_time_round_trips_through_parse_time():
    for secs in [1, 59, 3600, 86399, 86400, 93784, 10 * 86400 + 1]:
        assert parse_time(format_time(secs)) == secs
    assert format_time(None) == "UNLIMITED" and format_time(93784) == "1-02:03:04"


def test_parse_partitions_reads_limits_priority_and_gpus():
    parts = parse_partitions(PARTITIONS_O)
    assert list(parts) == ["debug", "high", "gpu"]
    debug, high, gpu = parts["debug"], parts["high"], parts["gpu"]
    assert debug.default and not high.default and not gpu.default
    assert debug.node_names == ("n1", "n2", "n3", "n4") and debug.total_nodes == 4
    assert debug.max_time_s == 7200 and high.max_time_s == 86400 and debug.max_nodes is None
    assert (debug.priority_tier, debug.preempt_mode, debug.grace_time_s) == (1, "REQUEUE", 20)
    assert (high.priority_tier, high.preempt_mode) == (10, "OFF")
    assert debug.gpus == 0 and debug.tres["mem"] == "16000M"
    assert gpu.gpus == 512 and gpu.gpus_per_node == 8 and gpu.max_nodes == 32
    assert (
        gpu.default_time_s == 3600 and gpu.node_names[0] == "gpu001" and len(gpu.node_names) == 64
    )


def test_parse_partitions_reads_the_multi_line_form_alike():
    assert parse_partitions(PARTITION_BLOCK) == {"debug": parse_partitions(PARTITIONS_O)["debug"]}


def test_parse_kv_keeps_equals_signs_inside_values():
    assert parse_kv("A=1 TRES=cpu=8,mem=1G B=(null)") == {
        "A": "1",
        "TRES": "cpu=8,mem=1G",
        "B": "(null)",
    }


PARTS = parse_partitions(PARTITIONS_O)


def test_validate_request_accepts_a_request_that_fits():
    assert validate_request("gpu", 32, "1-00:00:00", 8, PARTS) == []
    assert validate_request(None, 4, "30", 0, PARTS) == []  # None: the default partition


def test_validate_request_names_unknown_partition_and_lists_known():
    assert validate_request("gpux", 1, "10", 0, PARTS) == [
        "cluster.partition: unknown partition 'gpux'; set cluster.partition to one of: "
        "debug, high, gpu"
    ]


def test_validate_request_names_too_many_nodes_with_the_limit():
    assert validate_request("debug", 64, "10", 0, PARTS) == [
        "cluster.nodes: 64 nodes exceed partition 'debug' (4 at most); set cluster.nodes<=4 "
        "or pick a bigger partition"
    ]
    assert "(32 at most)" in validate_request("gpu", 33, "10", 8, PARTS)[0]  # MaxNodes per job


def test_validate_request_names_time_above_max_time():
    assert validate_request("debug", 1, "03:00:00", 0, PARTS) == [
        "cluster.time: '03:00:00' exceeds partition 'debug' MaxTime 02:00:00; set "
        "cluster.time<=02:00:00 or pick another partition"
    ]
    assert validate_request("debug", 1, "UNLIMITED", 0, PARTS)[0].startswith("cluster.time:")
    assert validate_request("debug", 1, "1h", 0, PARTS) == [
        "cluster.time: '1h' is not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS"
    ]


def test_validate_request_names_gpus_where_the_partition_has_none():
    assert validate_request("high", 2, "10", 8, PARTS) == [
        "cluster.gpus_per_node: 8 GPUs per node, but partition 'high' has no GPUs; set "
        "cluster.gpus_per_node=0 or pick a GPU partition"
    ]
    assert "has 8;" in validate_request("gpu", 2, "10", 16, PARTS)[0]


def test_validate_request_uses_the_callers_key_names():
    errs = validate_request("debug", 64, "10", 0, PARTS, keys={"nodes": "nodes"})
    assert errs[0].startswith("nodes: 64 nodes") and "set nodes<=4" in errs[0]


SRUN_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[007-008,010]",
    "SLURM_STEP_NODELIST": "gpu[007-008,010]",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "6",
    "SLURM_NODEID": "2",
    "SLURM_TASKS_PER_NODE": "2(x3)",
}


def test_rendezvous_from_env_gives_the_five_torch_variables():
    rv = rendezvous_from_env(SRUN_ENV)
    assert rv == {
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(10000 + 4242),
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "6",
        "NODE_RANK": "2",
        "LOCAL_WORLD_SIZE": "2",
    }


def test_rendezvous_master_is_first_node_of_the_step():
    env = dict(SRUN_ENV, SLURM_STEP_NODELIST="gpu010", SLURM_STEP_NUM_TASKS="2")
    rv = rendezvous_from_env(env)
    assert rv["MASTER_ADDR"] == "gpu010" and rv["WORLD_SIZE"] == "2"
    del env["SLURM_STEP_NODELIST"]
    assert rendezvous_from_env(env)["MASTER_ADDR"] == "gpu007"


def test_rendezvous_outside_srun_says_what_is_missing():
    with pytest.raises(SlurmError, match="SLURM_PROCID is not set; start this under srun"):
        rendezvous_from_env({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"})


def test_master_port_is_deterministic_and_in_range():
    assert master_port("4242") == master_port("4242") == 14242
    assert master_port("22768") == 10000 and master_port("22767") == 32767
    # Never in Linux's default ephemeral range (32768..60999), where client sockets get ports.
    assert all(10000 <= master_port(j) < 32768 for j in ["1", "123456789", "77_3", "x"])


def test_tasks_per_node_expands_slurms_repeat_syntax():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("4") == [4]


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("gpu[001-003,100]", ["gpu001", "gpu002", "gpu003", "gpu100"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        (
            "a[1-2]b[1-2]c[1-2]",
            ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"],
        ),  # Slurm's own order
        ("rack[1-2]-n[01-02],login", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02", "login"]),
        ("n[8-010]", ["n8", "n9", "n10"]),
        ("n[1,1]", ["n1", "n1"]),
        ("n1,,n2", ["n1", "n2"]),
    ],
)
def test_expand_hostlist_examples(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text", ["n[1-3]-ib", "n[3-1]", "n[]", "n[1-2", "n1]", "n[[1]]", "n[a-b]", "n[1-70000]"]
)
def test_expand_hostlist_rejects_what_slurm_rejects(text):
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(text)


@pytest.mark.parametrize(
    "hosts, text",
    [
        (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
        (["n09", "n10", "n8"], "n[09-10,8]"),
        (["n1-ib", "n2-ib"], "n1-ib,n2-ib"),
        (["a1b3", "a1b4", "a2b3"], "a1b[3-4],a2b3"),
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["login"], "login"),
        (["n7"], "n7"),
        ([], ""),
    ],
)
def test_compress_hostlist_examples(hosts, text):
    assert compress_hostlist(hosts) == text
    assert expand_hostlist(text) == hosts
