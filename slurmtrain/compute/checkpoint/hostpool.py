"""Host copies of a checkpoint's tensors for async saves (compute node), in reused buffers.

Device-to-host copies are queued on the source device's current stream and complete through a CUDA
event recorded there after them. Never `torch.cuda.synchronize()`: from a thread whose current device
is another GPU (a new thread's is 0) it waits on the wrong device and returns before the copies land,
and `torch.save` would then write the previous save's bytes (checksummed, so nothing notices).
"""

from __future__ import annotations

import copy
import threading
from typing import Callable

import torch

_ATOMS = (str, bytes, int, float, bool, complex, type(None))


class HostPool:
    """Host copies of tensors, into buffers reused from one save to the next.

    A fresh host allocation page-faults (several times slower than a reused buffer; pinned ones on
    GPUs slower still). Saves repeat the same storages in the same order, so buffer `i` of one save
    fits buffer `i` of the next.
    """

    def __init__(self) -> None:
        self.buffers: list[torch.UntypedStorage] = []
        self.used = 0
        self.storages: dict[tuple[str, int], torch.UntypedStorage] = {}
        self.lazy = False  # copy later, in `run` (from the writer's thread or the step hook)
        self.tasks: list[tuple[torch.UntypedStorage, torch.UntypedStorage, torch.device]] = []
        self.queued: dict[torch.device, torch.cuda.Stream] = {}  # copies not yet waited for
        self.lock = threading.Lock()

    def begin(self, lazy: bool = False) -> None:
        self.run()  # a copy still pending (a save given up) never outlives its save
        self.used, self.storages, self.lazy = 0, {}, lazy

    @property
    def pending(self) -> bool:
        return bool(self.tasks)

    def run(self) -> None:
        """Do the copies `tensor` deferred (lazy mode); whoever comes second waits for the first."""
        with self.lock:
            tasks, self.tasks = self.tasks, []
            for host, source, device in tasks:
                self._copy(host, source, device)
            self.sync()

    def _copy(
        self, host: torch.UntypedStorage, source: torch.UntypedStorage, device: torch.device
    ) -> None:
        if device.type != "cuda":
            host.copy_(source)
            return
        with torch.cuda.device(device):  # the source's stream, whichever thread this is
            host.copy_(source, non_blocking=True)
            self.queued[device] = torch.cuda.current_stream(device)

    def _buffer(self, nbytes: int, pinned: bool) -> torch.UntypedStorage:
        i = self.used
        self.used += 1
        if i < len(self.buffers) and self.buffers[i].nbytes() == nbytes:
            return self.buffers[i]
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        if i < len(self.buffers):
            self.buffers[i] = buffer
        else:
            self.buffers.append(buffer)
        return buffer

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_sparse or t.is_quantized or type(t) not in (torch.Tensor, torch.nn.Parameter):
            return t.detach().to("cpu", copy=True)
        source = t.untyped_storage()
        key = (str(t.device), source.data_ptr())
        host = self.storages.get(key)
        if host is None:
            device = t.device
            host = self._buffer(
                source.nbytes(), pinned=device.type == "cuda" and torch.cuda.is_available()
            )
            if self.lazy:
                self.tasks.append((host, source, device))
            else:
                self._copy(host, source, device)
            self.storages[key] = host
        out = torch.empty(0, dtype=t.dtype).set_(host, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(out, requires_grad=t.requires_grad)
        return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out

    def copy(self, obj: object) -> object:
        """A deep copy of a state dict whose tensors all live in host memory."""
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, _ATOMS):
            return obj
        if isinstance(obj, dict):
            out = obj.__class__() if type(obj) is not dict else {}
            for key, value in obj.items():
                out[key] = self.copy(value)
            if getattr(obj, "__dict__", None):  # e.g. state_dict()._metadata (module versions)
                out.__dict__.update(copy.deepcopy(obj.__dict__))
            return out
        if isinstance(obj, list):
            return [self.copy(v) for v in obj]
        if isinstance(obj, tuple):
            items = [self.copy(v) for v in obj]
            make: Callable[..., object] = obj.__class__  # a namedtuple takes its fields apart
            return make(*items) if hasattr(obj, "_fields") else make(items)
        return copy.deepcopy(obj)  # small objects (loss scaler, fragment maps, namespaces)

    def sync(self) -> None:
        """Wait for the queued copies: an event after them on each source stream, not the device."""
        queued, self.queued = self.queued, {}
        for device, stream in queued.items():
            with torch.cuda.device(device):
                done = torch.cuda.Event()
                done.record(stream)
            done.synchronize()
