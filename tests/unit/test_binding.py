"""What DeepSpeed is given when the site binds GPUs to tasks, checked on CPUs.

The entrypoint's own code (compute/distributed.py: placement, export, rank_device, as
compute/attempt.py calls them) runs under an emulated Slurm task: torch.cuda counts the devices
CUDA_VISIBLE_DEVICES lists and refuses an ordinal past them ("invalid device ordinal", as CUDA
does). Then DeepSpeed's own code runs against it: its CUDA accelerator, the `device_id` its
TorchBackend passes to init_process_group, the engine's set_device(LOCAL_RANK) and ZeRO-3's
local device. Nothing of Slurm is mocked: a task's environment is only variables.
"""

from __future__ import annotations

import os
import types
from datetime import timedelta
from typing import Optional

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from slurmtrain.compute import distributed  # noqa: E402

JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "11",
    "SLURM_NTASKS": "16",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "3",
    "SLURM_NTASKS_PER_NODE": "8",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "SLURM_STEP_NODELIST": "gpu[001-002]",
    "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7",
}
CLEARED = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "SUBMITIT_LOCAL_JOB_ID",
    "SUBMITIT_LOCAL_GLOBALID",
    "CUDA_VISIBLE_DEVICES",
    distributed.CPU_STAND_IN,
)


class FakeCuda:
    """torch.cuda as a task sees it: `count` devices, ordinals past them refused."""

    def __init__(self, count: int) -> None:
        self.count, self.current, self.calls = count, 0, []

    def set_device(self, device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        self.calls.append(index)
        if not 0 <= index < self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.current = index


def _task(monkeypatch, visible: Optional[str], count: int, localid: str = "3") -> FakeCuda:
    for key in CLEARED:  # set then removed: monkeypatch restores (or removes) it afterwards
        monkeypatch.setenv(key, "x")
        monkeypatch.delenv(key)
    for key, value in {**JOB, "SLURM_LOCALID": localid}.items():
        monkeypatch.setenv(key, value)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    fake = FakeCuda(count)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", fake.set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current)
    return fake


def _what_deepspeed_is_given(monkeypatch, fake: FakeCuda) -> dict:
    """The entrypoint's calls (compute/attempt.py run/_run), then DeepSpeed's own."""
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator
    from deepspeed.comm.torch import TorchBackend
    from deepspeed.runtime.engine import DeepSpeedEngine

    where = distributed.placement(os.environ)
    distributed.export(where)
    torch.cuda.set_device(distributed.rank_device(8, os.environ, where.local_rank))
    attempt_device = fake.current

    monkeypatch.setattr(real_accelerator, "ds_accelerator", CUDA_Accelerator())
    given: dict = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)

    def init_process_group(
        backend=None,
        init_method=None,
        timeout=None,
        world_size=-1,
        rank=-1,
        store=None,
        group_name="",
        pg_options=None,
        device_id=None,
    ):
        given.update(device_id=device_id)  # DeepSpeed passes device_id when the signature has it

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: "nccl")
    backend = TorchBackend.__new__(TorchBackend)
    backend.init_process_group("nccl", timedelta(seconds=60), None, where.rank, where.world_size)

    from deepspeed.runtime import engine as engine_module

    monkeypatch.setattr(engine_module.dist, "get_world_size", lambda *a, **k: where.world_size)
    monkeypatch.setattr(engine_module.dist, "get_rank", lambda *a, **k: where.rank)
    engine = types.SimpleNamespace()
    DeepSpeedEngine._configure_with_arguments(engine, None, None)
    DeepSpeedEngine._set_distributed_vars(engine, None)  # set_device(LOCAL_RANK), as DeepSpeed does
    zero3 = real_accelerator.get_accelerator().device_name(os.environ["LOCAL_RANK"])
    return {
        "LOCAL_RANK": os.environ["LOCAL_RANK"],
        "attempt_device": attempt_device,
        "device_id": given["device_id"].index,
        "engine_device": engine.device.index,
        "zero3_device": zero3,
        "set_device_calls": fake.calls,
        "rank": where.rank,
        "local_rank": where.local_rank,
    }


@pytest.mark.parametrize(
    "visible,count,localid,device",
    [
        ("5", 1, "3", 0),  # --gpus-per-task=1 / --gpu-bind=single:1: the task sees its GPU as 0
        ("0,1,2,3,4,5,6,7", 8, "3", 3),  # no binding: the local id's
        ("4,5,6,7", 4, "5", 1),  # --gpu-bind=closest: its socket's four; physical id 5 is the 2nd
        (None, 1, "3", 0),  # no CUDA_VISIBLE_DEVICES, a cgroup shows one device: it is 0
    ],
)
def test_deepspeed_gets_the_device_the_task_sees(monkeypatch, visible, count, localid, device):
    fake = _task(monkeypatch, visible, count, localid)
    seen = _what_deepspeed_is_given(monkeypatch, fake)
    assert seen["rank"] == 11 and seen["local_rank"] == int(localid)  # Slurm's ids kept
    assert seen["LOCAL_RANK"] == str(device), seen
    assert seen["attempt_device"] == device
    assert seen["device_id"] == device  # init_process_group(device_id=...)
    assert seen["engine_device"] == device  # the engine's set_device(LOCAL_RANK)
    assert seen["zero3_device"] == f"cuda:{device}"
    assert all(call == device for call in seen["set_device_calls"]), seen


def test_export_alone_agrees_with_the_binding_before_torch_is_imported(monkeypatch):
    # attempt.py exports before it imports torch (and before any device call): LOCAL_RANK must
    # already name the task's device, which is what init_distributed reads first.
    _task(monkeypatch, "5", 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # inherited from the submitting shell: not ours
    distributed.export(distributed.placement(os.environ))
    assert os.environ["LOCAL_RANK"] == "0"
    assert os.environ["RANK"] == "11" and os.environ["LOCAL_WORLD_SIZE"] == "8"


def test_a_binding_it_cannot_read_is_left_to_rank_device_to_refuse(monkeypatch):
    # Three tasks, two devices listed and no step GPUs to match: export does not guess (it keeps
    # the local id, and cannot fail before the ledger can record it); rank_device refuses.
    fake = _task(monkeypatch, "4,5", 2, localid="2")
    monkeypatch.delenv("SLURM_STEP_GPUS")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "3")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "3(x2)")
    where = distributed.placement(os.environ)
    distributed.export(where)
    assert os.environ["LOCAL_RANK"] == "2"
    with pytest.raises(distributed.DeviceError, match="cannot tell which is its own"):
        distributed.rank_device(8, os.environ, where.local_rank)
    assert fake.calls == []
