"""One home for what the harness knows about devices: which one a run uses, its precision,
its peak throughput, and the few calls that differ between CPU and GPU.

Every function takes the device as a parameter and asks ``torch.cuda`` only through the
module attribute at call time, so each GPU branch runs in CPU tests with ``torch.cuda``'s
queries replaced (``tests/test_cost_devices.py``): the first GPU run is not the first run of
these lines.

**GPUs for workers** (:func:`visible_gpus`, :func:`assign_gpus`): ``harness study run
--workers N`` gives each worker its own GPUs through ``CUDA_VISIBLE_DEVICES``. They are
counted without initialising CUDA in the counting process (:func:`gpu_count`), because the
first worker is that process and its own ``CUDA_VISIBLE_DEVICES`` is set after the count.

**Peak throughput** (:data:`PEAKS`): dense (no sparsity) bf16 tensor-core FLOP/s from the
vendor's datasheets, the denominator of model FLOPs utilisation (MFU). It is deliberately
not Lightning's table (``lightning.fabric.utilities.throughput``), which gives the H200 a
different figure from the H100 SXM although both run the same GH100 die at the same clocks
(989 TFLOP/s dense bf16). Benchmarks (``harness bench``) read the same table. A device that
matches no row has no MFU (the run says so by not logging ``cost/mfu``), never a guessed one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Literal

from harness.errors import HarnessError


@dataclass(frozen=True)
class DevicePeak:
    """The dense bf16 peak of one accelerator model, and where the number comes from."""

    name: str
    pattern: str  # regular expression on torch.cuda.get_device_name (case-insensitive)
    bf16_tflops: float
    source: str


#: Accelerators by name, most specific first (the first matching row wins).
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("H100 PCIe", r"H100.*PCIe", 756.0, "NVIDIA H100 datasheet: 1,513 TFLOP/s bf16 with sparsity"),
    DevicePeak("H100 SXM", r"H100(?!.*(?:PCIe|NVL))", 989.0, "NVIDIA H100 datasheet: 1,979 TFLOP/s bf16 with sparsity"),
    DevicePeak("H200 SXM", r"H200(?!.*NVL)", 989.0, "NVIDIA H200 datasheet: 1,979 TFLOP/s bf16 with sparsity"),
    DevicePeak("A100", r"A100", 312.0, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense"),
)


def device_name(device: Any) -> str:
    """The accelerator's model name (``NVIDIA H100 80GB HBM3``), or ``cpu``."""
    import torch

    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return str(device.type)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (``550.54.15``) from ``/proc/driver/nvidia/version``
    (Linux), or None where there is none to read."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def device_tags(device: Any) -> dict[str, str]:
    """What a run records about the device it trained on (:class:`harness.keys.Tag`): the
    GPU's name, compute capability, the CUDA version torch was built with and the driver's
    version; on the CPU, the CPU's model name."""
    import torch

    from harness.keys import Tag

    if device.type != "cuda":
        return {Tag.DEVICE: f"{device.type}: {cpu_name()}"}
    major, minor = torch.cuda.get_device_capability(device)
    tags = {Tag.DEVICE: device_name(device), Tag.DEVICE_CAPABILITY: f"{major}.{minor}",
            Tag.CUDA_VERSION: str(torch.version.cuda)}
    driver = driver_version()
    if driver:
        tags[Tag.DRIVER_VERSION] = driver
    return tags


def peak_for(name: str) -> DevicePeak | None:
    """The table's row for a device name, or None when the table does not know it."""
    return next((p for p in PEAKS if re.search(p.pattern, name, re.IGNORECASE)), None)


def peak_flops(device: Any) -> float | None:
    """Dense bf16 peak FLOP/s of ``device``; None for the CPU and unknown accelerators."""
    if device.type != "cuda":
        return None
    row = peak_for(device_name(device))
    return row.bf16_tflops * 1e12 if row else None


def mfu(flops_per_token: float, tokens_per_s: float, device: Any) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's dense bf16 peak."""
    peak = peak_flops(device)
    if peak is None or flops_per_token <= 0 or tokens_per_s <= 0:
        return None
    return flops_per_token * tokens_per_s / peak


def run_device(accelerator: str) -> Any:
    """The device a run with ``train.accelerator`` trains on (its first one, with several)."""
    import torch

    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def supports_bf16(device: Any) -> bool:
    """bf16 tensor cores: compute capability 8.0 (Ampere) or newer. On the CPU bf16 autocast
    always runs (slowly where the CPU lacks AVX-512 bf16), so ``auto`` never picks it there."""
    import torch

    if device.type != "cuda":
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= (8, 0)


def precision(requested: str, device: Any) -> str:
    """Lightning's precision for ``train.precision``: ``auto`` is bf16-mixed on a GPU that
    supports it and full fp32 everywhere else; anything else is passed through (``bf16-mixed``
    works on the CPU too)."""
    if requested != "auto":
        return requested
    return "bf16-mixed" if supports_bf16(device) else "32-true"


def matmul_precision(device: Any, tf32: bool | None) -> None:
    """TF32 tensor cores for fp32 matrix products on a GPU (``train.tf32``; None: on), set
    for the whole process each time a run starts (a study worker's trials may differ); the
    CPU's setting is left as it is."""
    import torch

    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest" if tf32 is False else "high")


def deterministic(device: Any, requested: bool | None) -> bool | Literal["warn"]:
    """Lightning's ``deterministic`` for ``train.deterministic``: unset, ``"warn"`` on the CPU
    (deterministic algorithms, which cost nothing there, and a warning where an operation has
    none) and off elsewhere (deterministic kernels slow a GPU's every step); set, as given
    (``true`` refuses an operation without a deterministic algorithm)."""
    if requested is not None:
        return requested
    return "warn" if device.type == "cpu" else False


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (a no-op on the CPU): timings read after it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: Any) -> None:
    """Start a new high-water mark of the device allocator (GPU only)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def allocator_peak_bytes(device: Any) -> int | None:
    """The device allocator's high-water mark since :func:`reset_peak`; None on the CPU,
    which has no allocator statistics (see :mod:`harness.runtime.memory` for what is measured there)."""
    import torch

    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def free_bytes(device: Any) -> int | None:
    """Free memory on a GPU (None on the CPU: there the data is already in host memory)."""
    import torch

    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


# -- GPUs for a machine's workers --------------------------------------------------------------
class DevicesError(HarnessError):
    """More workers than the machine's GPUs can give their own."""


def gpu_count() -> int:
    """The GPUs this process can see (``CUDA_VISIBLE_DEVICES`` applied), counted without
    initialising CUDA here: 0 with a CPU-only build of torch; else through NVML, as
    ``torch.cuda.device_count`` counts when ``PYTORCH_NVML_BASED_CUDA_CHECK`` is set; where
    NVML is missing, a child process counts (CUDA is initialised there, not here). The one
    function that asks the hardware: tests replace it to fake a machine's GPUs."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0
    count = int(torch.cuda._device_count_nvml())
    if count >= 0:
        return count
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, timeout=300, check=False)
    return int(out.stdout.strip() or 0) if out.returncode == 0 else 0


def visible_gpus() -> list[str]:
    """The GPUs a command may hand to its workers, named as ``CUDA_VISIBLE_DEVICES`` names
    them: the variable's entries where it is set (the pool a user or a scheduler gave this
    process; indices, ``GPU-`` UUIDs or ``MIG-`` names), else ``0`` .. ``gpu_count() - 1``."""
    count = gpu_count()
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(count)]
    # CUDA stops at the first entry it cannot use: the count says how many are usable
    return [e.strip() for e in given.split(",") if e.strip()][:count]


def assign_gpus(pool: list[str], workers: int, per_worker: int) -> list[list[str]]:
    """Each worker's GPUs: worker ``i`` gets ``pool[i*k:(i+1)*k]`` (``k = per_worker``); none
    (every worker sees the whole pool) when the pool is empty or ``per_worker`` is 0. More
    workers than the pool can give ``k`` GPUs each is refused."""
    if not pool or per_worker == 0:
        return [[] for _ in range(workers)]
    if workers * per_worker > len(pool):
        most = len(pool) // per_worker
        raise DevicesError(
            f"--workers {workers} with {per_worker} GPU(s) per worker needs {workers * per_worker} "
            f"GPUs; this machine shows {len(pool)} ({', '.join(pool)}"
            f"{', from CUDA_VISIBLE_DEVICES' if 'CUDA_VISIBLE_DEVICES' in os.environ else ''}). "
            f"Use --workers {max(most, 1)}" + (f" --gpus-per-worker {per_worker}" if most else
                                                f" --gpus-per-worker {len(pool)}")
            + ", or --gpus-per-worker 0 to let the workers share the GPUs (each trains on the "
              "first one it sees; several trials then share one GPU's memory and time).")
    return [pool[i * per_worker:(i + 1) * per_worker] for i in range(workers)]


def describe_gpus(assigned: list[list[str]]) -> str:
    """``4 workers on GPUs 0,1,2,3`` (one each) or ``2 workers on GPUs 0,1 | 2,3``."""
    n = len(assigned)
    workers = f"{n} worker{'s' if n != 1 else ''}"
    if all(len(a) == 1 for a in assigned):
        return f"{workers} on GPU{'s' if n != 1 else ''} {','.join(a[0] for a in assigned)}"
    return f"{workers} on GPUs {' | '.join(','.join(a) for a in assigned)} ({len(assigned[0])} each)"
