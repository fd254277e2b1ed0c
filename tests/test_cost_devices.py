"""Every GPU-only line of the cost code, run on the CPU: the same functions with the device as
a parameter (``torch.device("cuda", 0)`` exists without a GPU), ``torch.cuda``'s queries
replaced by fakes that answer as a GPU would and record how they were asked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.data.formats import LM
from harness.keys import Metric
from harness.run import batches
from harness.run.meters import StepProbe
from harness.run.system import HarnessDataModule
from harness.runtime import devices
from harness.runtime.memory import PeakMemory

CUDA = torch.device("cuda", 0)


class FakeCuda:
    """What ``torch.cuda`` answers on one H100 with ``free`` bytes free; calls are recorded."""

    def __init__(self, name: str = "NVIDIA H100 80GB HBM3", capability: tuple[int, int] = (9, 0),
                 peak: int = 3 * 2**30, free: int = 70 * 2**30) -> None:
        self.name, self.capability, self.peak, self.free = name, capability, peak, free
        self.calls: list[tuple[str, Any]] = []

    def install(self, mp: pytest.MonkeyPatch) -> FakeCuda:
        def record(fn: str, result: Any = None) -> Any:
            def call(device: Any = None) -> Any:
                self.calls.append((fn, device))
                return result() if callable(result) else result
            return call

        mp.setattr(torch.cuda, "get_device_name", record("get_device_name", lambda: self.name))
        mp.setattr(torch.cuda, "get_device_capability", record("capability", lambda: self.capability))
        mp.setattr(torch.cuda, "synchronize", record("synchronize"))
        mp.setattr(torch.cuda, "reset_peak_memory_stats", record("reset_peak"))
        mp.setattr(torch.cuda, "max_memory_allocated", record("max_allocated", lambda: self.peak))
        mp.setattr(torch.cuda, "mem_get_info", record("mem_get_info", lambda: (self.free, 80 * 2**30)))
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "current_device", lambda: 0)
        return self

    def asked(self, fn: str) -> list[Any]:
        return [device for name, device in self.calls if name == fn]


@pytest.fixture
def cuda(monkeypatch):
    return FakeCuda().install(monkeypatch)


@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 SXM5 80GB", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_the_peak_table_knows_each_device_by_name_and_guesses_none(name, tflops):
    row = devices.peak_for(name)
    assert (row.bf16_tflops if row else None) == tflops


def test_mfu_divides_achieved_flops_by_the_named_devices_peak(monkeypatch):
    fake = FakeCuda(name="NVIDIA H200").install(monkeypatch)
    # 6 * 1e9 FLOPs per token at 50,000 tokens/s is 3e14 FLOP/s of 989e12
    assert devices.mfu(6e9, 5e4, CUDA) == pytest.approx(3e14 / 989e12)
    assert fake.asked("get_device_name") == [CUDA]
    fake.name = "Some Future GPU"
    assert devices.mfu(6e9, 5e4, CUDA) is None  # unknown: no MFU rather than a guess
    assert devices.mfu(6e9, 5e4, torch.device("cpu")) is None


def test_auto_precision_is_bf16_on_ampere_or_newer_and_fp32_elsewhere(monkeypatch):
    fake = FakeCuda(capability=(9, 0)).install(monkeypatch)
    assert devices.precision("auto", CUDA) == "bf16-mixed"
    assert fake.asked("capability") == [CUDA]
    fake.capability = (7, 5)  # Turing: no bf16 tensor cores
    assert devices.precision("auto", CUDA) == "32-true"
    assert devices.precision("auto", torch.device("cpu")) == "32-true"
    assert devices.precision("bf16-mixed", torch.device("cpu")) == "bf16-mixed"  # as asked


def test_the_run_device_is_the_current_gpu_when_one_is_asked_for_or_available(cuda):
    assert devices.run_device("auto") == CUDA
    assert devices.run_device("gpu") == CUDA
    assert devices.run_device("cpu") == torch.device("cpu")


def test_synchronise_and_allocator_peak_ask_the_runs_device_and_skip_the_cpu(cuda):
    devices.synchronize(CUDA)
    devices.reset_peak(CUDA)
    assert devices.allocator_peak_bytes(CUDA) == cuda.peak
    assert devices.free_bytes(CUDA) == cuda.free
    cpu = torch.device("cpu")
    devices.synchronize(cpu)
    devices.reset_peak(cpu)
    assert devices.allocator_peak_bytes(cpu) is None and devices.free_bytes(cpu) is None
    assert cuda.calls == [("synchronize", CUDA), ("reset_peak", CUDA), ("max_allocated", CUDA),
                          ("mem_get_info", CUDA)]


def test_a_gpu_runs_peak_is_the_allocator_high_water_mark_reset_at_its_start(cuda):
    with PeakMemory(CUDA) as peak:
        assert cuda.asked("reset_peak") == [CUDA]
    metrics = peak.metrics()
    assert metrics[Metric.PEAK_GPU_MB] == cuda.peak / 2**20
    assert Metric.PROCESS_PEAK_RSS_MB in metrics  # the process-level figure, named as such
    with PeakMemory(torch.device("cpu")) as peak:
        pass
    assert Metric.PEAK_GPU_MB not in peak.metrics()


def test_the_training_split_goes_to_the_gpu_only_when_it_fits_in_an_eighth_of_free_memory(cuda):
    assert batches.fits_on_device(cuda.free // 8, CUDA)
    assert not batches.fits_on_device(cuda.free // 8 + 1, CUDA)
    assert batches.fits_on_device(2**60, torch.device("cpu"))  # already in host memory


def _trainer(device: Any) -> Any:
    return SimpleNamespace(strategy=SimpleNamespace(root_device=device), global_rank=0, world_size=1)


def test_a_split_too_large_for_the_gpu_streams_from_pinned_memory(monkeypatch, registry):
    import harness

    fake = FakeCuda(free=1024).install(monkeypatch)  # 1 KiB free: nothing fits
    task = harness.create_task("copy", length=4, vocab=4, num_train=64, num_val=16, registry=registry)
    dm = HarnessDataModule(task, LM, batch_size=8, seed=0)
    dm.trainer = _trainer(CUDA)  # type: ignore[assignment]
    train = dm.train_dataloader()
    assert not dm.on_device and train.pin_memory
    assert fake.asked("mem_get_info") == [CUDA]
    assert all(loader.pin_memory for loader in dm.val_dataloader())
    dm.trainer = _trainer(torch.device("cpu"))  # type: ignore[assignment]
    assert isinstance(dm.train_dataloader(), batches.DeviceBatches) and dm.on_device
    assert not any(loader.pin_memory for loader in dm.val_dataloader())


def test_the_step_probe_on_a_gpu_counts_flops_and_restarts_the_peak_after_an_eager_step(cuda):
    """On a GPU the probe counts FLOPs only (the allocator measures memory); a compiled run's
    high-water mark restarts after the probed (eager) step."""
    probe = StepProbe(LM, step=1, compiled=True)
    trainer = SimpleNamespace(global_step=1, max_steps=5, optimizers=[], world_size=1,
                              callback_metrics={})
    module = torch.nn.Linear(1, 1)  # a module: the probe adds what its modules declare
    module.device = CUDA  # type: ignore[assignment]
    batch = {"tokens": torch.zeros(2, 3, dtype=torch.long)}
    probe.on_train_batch_start(trainer, module, batch, 0)
    assert probe._memory is None  # no tensor accounting on a GPU
    torch.ones(4, 8) @ torch.ones(8, 2)  # 2 * 4 * 8 * 2 = 128 FLOPs, counted
    probe.on_train_batch_end(trainer, module, None, batch, 0)
    assert float(trainer.callback_metrics[Metric.FLOPS_PER_TOKEN]) == 128 / 6
    assert cuda.asked("reset_peak") == [CUDA]
    assert Metric.PEAK_TENSOR_MB not in trainer.callback_metrics
