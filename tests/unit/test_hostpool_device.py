"""Async saves on local ranks 1-7: the host copies are made and waited for on the rank's own GPU.

A CPU machine has no CUDA, so torch's CUDA API is replaced by recorders that keep each thread's
current device as CUDA does (a new thread starts on device 0), and the source tensors say they live
on cuda:3. The copies themselves are real (CPU to CPU); what is observed is which device is current
when each copy is queued and what is waited on afterwards.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from slurmtrain.common.schema import CheckpointConfig
from slurmtrain.compute.checkpoint import manager
from slurmtrain.compute.checkpoint.hostpool import HostPool
from slurmtrain.compute.context import Placement, RankContext
from slurmtrain.compute.faults.watchdog import Watchdog

RANK_GPU = 3


class FakeCuda:
    """Records torch.cuda calls; each thread's current device starts at 0, as in CUDA."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.calls: list[tuple[str, int]] = []

    def current(self) -> int:
        return getattr(self.local, "device", 0)

    def set_device(self, device: Any) -> None:
        self.local.device = torch.device(device).index or 0
        self.calls.append(("set_device", self.current()))

    @contextmanager
    def device(self, device: Any) -> Iterator[None]:
        before = self.current()
        self.local.device = torch.device(device).index or 0
        try:
            yield
        finally:
            self.local.device = before

    def synchronize(self, device: Any = None) -> None:
        target = self.current() if device is None else torch.device(device).index or 0
        self.calls.append(("synchronize", target))

    def current_stream(self, device: Any = None) -> tuple[str, int]:
        return ("stream", self.current() if device is None else torch.device(device).index or 0)

    def event(self, *args: Any, **kwargs: Any) -> Any:
        cuda = self

        class Event:
            stream: tuple[str, int] | None = None

            def record(self, stream: Any = None) -> None:
                self.stream = stream or cuda.current_stream()
                cuda.calls.append(("event_record", self.stream[1]))

            def synchronize(self) -> None:
                assert self.stream is not None, "an event waited on before it was recorded"
                cuda.calls.append(("event_synchronize", self.stream[1]))

        return Event()


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    on_gpu: set[int] = set()
    real_device = torch._C.TensorBase.device

    def device(t: torch.Tensor) -> torch.device:
        if id(t) in on_gpu:
            return torch.device("cuda", RANK_GPU)
        return real_device.__get__(t)

    real_copy = torch.UntypedStorage.copy_

    def copy_(self: torch.UntypedStorage, src: Any, non_blocking: bool = False) -> Any:
        fake.calls.append(("copy", fake.current()))
        return real_copy(self, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "device", property(device))
    monkeypatch.setattr(torch.UntypedStorage, "copy_", copy_)
    monkeypatch.setattr(torch.cuda, "set_device", fake.set_device)
    monkeypatch.setattr(torch.cuda, "current_device", fake.current)
    monkeypatch.setattr(torch.cuda, "device", fake.device)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", fake.current_stream)
    monkeypatch.setattr(torch.cuda, "Event", fake.event)
    fake.on_gpu = on_gpu  # type: ignore[attr-defined]
    return fake


def _state(cuda: FakeCuda) -> dict[str, torch.Tensor]:
    state = {"fp32_partition": torch.arange(1024, dtype=torch.float32), "exp_avg": torch.ones(64)}
    cuda.on_gpu.update(id(t) for t in state.values())  # type: ignore[attr-defined]
    return state


def _in_a_new_thread(work: Any) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def _waits(calls: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [c for c in calls if c[0] in ("synchronize", "event_synchronize")]


def test_deferred_copies_run_from_another_thread_are_queued_and_waited_on_the_tensors_gpu(cuda):
    pool = HostPool()
    pool.begin(lazy=True)
    state = _state(cuda)
    host = pool.copy(state)
    _in_a_new_thread(pool.run)  # the checkpoint thread's flush (a new thread: device 0)
    copies = [device for name, device in cuda.calls if name == "copy"]
    assert copies == [RANK_GPU, RANK_GPU], cuda.calls  # queued on the source's stream
    assert _waits(cuda.calls) == [("event_synchronize", RANK_GPU)], cuda.calls
    last_copy = max(i for i, c in enumerate(cuda.calls) if c[0] == "copy")
    recorded = [i for i, c in enumerate(cuda.calls) if c == ("event_record", RANK_GPU)]
    assert recorded and recorded[0] > last_copy, cuda.calls  # the event comes after the copies
    assert torch.equal(host["fp32_partition"], torch.arange(1024, dtype=torch.float32))


def test_eager_copies_are_waited_for_through_an_event_not_a_device_wide_synchronize(cuda):
    pool = HostPool()
    pool.begin(lazy=False)
    pool.copy(_state(cuda))
    pool.sync()  # host_copy_done, on the main thread
    assert _waits(cuda.calls) == [("event_synchronize", RANK_GPU)], cuda.calls
    assert ("synchronize", 0) not in cuda.calls


def test_the_async_save_thread_binds_the_ranks_gpu_before_it_touches_cuda(cuda, tmp_path: Path):
    seen: list[int] = []

    class Writer:  # records the device current when the save thread flushes
        def flush(self) -> None:
            seen.append(cuda.current())

        def report(self, rank: int) -> dict[str, Any]:
            return {"rank": rank, "ok": True, "error": None, "files": {}}

        def discard(self) -> None:
            pass

    where = Placement(1, 1, 2, "localhost", 29500, None, "n1")
    watchdog = Watchdog(60.0, tmp_path / "stacks.txt", lambda why: None, 1)
    ctx = RankContext(where, torch.device("cuda", RANK_GPU), lambda row: None, watchdog)
    checkpointer = manager.Checkpointer(CheckpointConfig(async_save=True), ctx, tmp_path)
    checkpointer.writer = Writer()  # type: ignore[assignment]
    checkpointer.leads = [0, 0]
    job = manager._Save(10, {"world_size": 2}, 0.0, 0.0)
    _in_a_new_thread(lambda: checkpointer._background(job))
    assert seen == [RANK_GPU]
