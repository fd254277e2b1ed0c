"""Peak memory of a model, not of the process that trains it.

Two measurements, named for what they measure:

* ``cost/peak_gpu_mem_mb`` (GPU): the device allocator's high-water mark
  (``torch.cuda.max_memory_allocated``) over the training, reset when the run starts:
  parameters, gradients, optimiser state, activations and the batch, and nothing else.
* ``cost/peak_tensor_mb`` (CPU): the same quantity counted tensor by tensor, since the CPU
  allocator keeps no statistics. :class:`TensorMemory` is a ``TorchDispatchMode``: it starts
  from the storages alive at the start of a training step (parameters, gradients, buffers,
  optimiser state, the batch) and adds every storage an operation creates during the step,
  subtracting each one when it is freed (a weak reference to the storage). The peak of that
  sum is the step's peak tensor memory. It costs a Python call per operation, so it runs on
  one sampled step (see :class:`harness.run.fit.StepProbe`), never on every step. Storages
  are counted once however many views share them.

Resident-set size is not the model's memory: it includes the interpreter and libraries
(hundreds of MB), and glibc keeps freed heap memory, so it penalises layers that allocate
many mid-sized tensors. Runs still log it, as the process-level figure it is:
``cost/process_peak_rss_mb`` is the process's resident high-water mark during the run (Linux:
``VmHWM`` after resetting it through ``/proc/self/clear_refs``; elsewhere the lifetime peak,
``ru_maxrss``, which in a study worker can only grow from one trial to the next).
"""

from __future__ import annotations

import resource
import weakref
from collections.abc import Iterable
from functools import partial
from types import TracebackType
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from harness.keys import Metric
from harness.runtime import devices

MB = 2**20


# -- process level ---------------------------------------------------------------------------
def proc_status_kb(key: str) -> int | None:
    """A field of /proc/self/status in kB (``VmRSS``, ``VmHWM``), or None without /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return proc_status_kb("VmHWM") is not None


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.metrics()``: the device
    allocator's high-water mark on a GPU, the process's resident high-water mark always."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.per_run = False
        self.rss_kb = 0
        self.gpu_bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        devices.reset_peak(self.device)
        self.per_run = reset_peak_rss()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.gpu_bytes = devices.allocator_peak_bytes(self.device)
        if self.per_run:
            self.rss_kb = proc_status_kb("VmHWM") or 0
        else:  # no /proc: the best available is the lifetime peak
            self.rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def metrics(self) -> dict[str, float]:
        out = {Metric.PROCESS_PEAK_RSS_MB: self.rss_kb / 1024}
        if self.gpu_bytes is not None:
            out[Metric.PEAK_GPU_MB] = self.gpu_bytes / MB
        return out


# -- tensor level ----------------------------------------------------------------------------
def tensors_in(obj: Any) -> Iterable[Any]:
    """Every tensor in nested dicts, lists and tuples (other leaves are skipped)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_in(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from tensors_in(value)


class TensorMemory(TorchDispatchMode):
    """Bytes of tensor storages alive on one device type, and their peak, while active.

    ``meter.add(tensors)`` counts what is alive before (parameters, optimiser state, ...);
    inside ``with meter:`` every storage an operation returns is counted until it is freed.
    ``meter.peak`` is the highest total seen, ``meter.current`` the total now.
    """

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.current = self.peak = 0
        self._live: dict[int, tuple[int, Any]] = {}  # id(storage) -> (bytes, weak reference)

    def add(self, tensors: Iterable[Any]) -> None:
        for t in tensors:
            self._track(t)

    def _track(self, t: Any) -> None:
        if t.device.type != self.device_type:
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return
        key = id(storage)
        if key in self._live:
            return
        size = storage.nbytes()
        self._live[key] = (size, weakref.ref(storage, partial(self._freed, key)))
        self.current += size
        self.peak = max(self.peak, self.current)

    def _freed(self, key: int, _: Any = None) -> None:
        size, _ = self._live.pop(key, (0, None))
        self.current -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.add(tensors_in(out))
        return out
