"""A training step that never waits for the host: the real system's training step (forward,
loss, finiteness guard, logging, backward) makes no host round trip until its window of
training metrics closes (:mod:`harness.run.trainlog`), counted with the syncing operations and
``torch.cuda`` calls replaced; the meters synchronise once per window, not per step; TF32,
determinism and fused optimisers follow the device; runs record the device they trained on.

What only a GPU can show (the overlap itself, fused kernels) is in docs/performance.md's list
of what was not measured here."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.config import TrainConfig, parse_run_config
from harness.keys import Tag
from harness.run import meters
from harness.run.build import build
from harness.run.optim import make_optimizer, use_fused
from harness.run.plan import load_registry, plan
from harness.run.system import HarnessSystem, TrainingDiverged, masked_stats
from harness.runtime import devices

aten = torch.ops.aten
#: Operations whose result the host must wait for (a CUDA tensor's value, or its size).
SYNCING = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.unique_consecutive,
           aten._unique2, aten.repeat_interleave, aten.item}


class HostSyncs(TorchDispatchMode):
    """Counts host round trips: syncing operations (a value read with ``.item()``, ``bool()``,
    ``int()``; boolean indexing, ``nonzero``, ``masked_select``) at the dispatcher, and
    ``torch.cuda.synchronize``, ``Tensor.cpu``/``tolist``/``numpy`` replaced while active."""

    def __init__(self, monkeypatch: Any) -> None:
        super().__init__()
        self.calls: list[str] = []
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: self.calls.append("cuda.synchronize"))
        for name in ("cpu", "tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(name, original))

    def _counting(self, name: str, original: Any) -> Any:
        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.calls.append(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)
        return method

    active = False

    def __enter__(self) -> HostSyncs:
        self.active = True
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        self.active = False
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        packet = func.overloadpacket
        if packet in SYNCING:
            self.calls.append(str(packet))
        elif packet is aten.index and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                          for i in (args[1] if len(args) > 1 else [])):
            self.calls.append("boolean indexing")
        return func(*args, **(kwargs or {}))


def lm_system(**train: Any) -> tuple[HarnessSystem, Any]:
    cfg = parse_run_config({"task": {"name": "copy", "params": {"length": 8, "vocab": 5, "num_train": 16,
                                                               "num_val": 4}},
                            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 2, "heads": 2}},
                            "train": train})
    p = plan(cfg, load_registry(cfg, None))
    b = build(p)
    examples = b.task.examples("train", b.task.train_length)[:8]
    batch = p.fmt.collate(examples, b.task.task_kind)
    batch.pop("examples")
    return HarnessSystem(b.model, b.task, p.fmt, p.config.train), batch


def test_the_counter_sees_each_kind_of_host_round_trip(monkeypatch):
    counter = HostSyncs(monkeypatch)
    x = torch.randn(4, 3)
    with counter:
        x.sum().item()
        bool(torch.isfinite(x).all())
        x[x > 0]
        torch.cuda.synchronize()
        x.tolist()
    assert counter.calls == ["aten._local_scalar_dense", "aten._local_scalar_dense", "boolean indexing",
                             "cuda.synchronize", "Tensor.tolist"]


@pytest.mark.parametrize("micro", [None, 3])
def test_training_steps_never_wait_for_the_host_until_their_window_closes(monkeypatch, micro):
    system, batch = lm_system(batch_size=8, micro_batch_size=micro)
    assert system.train_metrics.every == system.train_metrics.check_every == 50  # val_every 250
    if micro:
        from harness.run.accumulate import split

        parts = split(batch, system.fmt, micro)  # the loader's work, before the step
    else:
        parts = [batch]
    counter = HostSyncs(monkeypatch)
    with counter:
        for i in range(3):
            for part in parts:
                system.training_step(part, i).backward()
    assert counter.calls == [] and len(system.train_metrics.pending) == 3 * len(parts)  # kept as they were
    system.train_metrics.every = 1  # the next step closes a window: one read of the steps so far
    with counter:
        for part in parts:
            system.training_step(part, 0)
    assert counter.calls == ["Tensor.tolist"]
    assert system.train_metrics.pending == [] and system.train_metrics.last["train/loss"] > 0


def test_the_old_loss_would_have_been_counted(monkeypatch):
    """Boolean-indexed logits and an ``isfinite`` branch: what the step did before."""
    system, batch = lm_system()
    logits = system(batch)
    counter = HostSyncs(monkeypatch)
    with counter:
        flat = logits[batch["loss_mask"]]
        if not torch.isfinite(flat.sum()):
            pass
        masked_stats(logits, batch)
    assert counter.calls == ["boolean indexing", "aten._local_scalar_dense"]


def test_a_loss_that_stops_being_finite_is_reported_with_its_step_when_read():
    system, _ = lm_system()
    for step, loss in enumerate([2.0, float("nan"), float("inf")]):  # later: the first one is kept
        system.train_metrics.add(step, torch.tensor([3 * loss, 1.0, 3.0], dtype=torch.float64))
    with pytest.raises(TrainingDiverged, match="became nan at step 1"):
        system.check_finite()


class FakeModule:
    device = torch.device("cuda", 0)


class FakeTrainer:
    global_step = 10


def test_throughput_synchronises_per_window_not_per_step(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(1))

    class Fmt:
        @staticmethod
        def tokens(batch: Any) -> int:
            return 64

    wait = meters.DataWait()
    meter = meters.Throughput(Fmt(), wait, skip=0)
    module, trainer = FakeModule(), FakeTrainer()
    for i in range(2 * meters.WINDOW):
        meter.on_train_batch_start(trainer, module, None, i)
        meter.on_train_batch_end(trainer, module, None, None, i)
    assert len(syncs) == 4  # two windows, each opened and closed once
    assert meter.tokens == 2 * meters.WINDOW * 64 and meter.seconds > 0


def test_tf32_and_determinism_follow_the_device(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert devices.deterministic(cpu, None) == "warn" and devices.deterministic(gpu, None) is False
    assert devices.deterministic(gpu, True) is True and devices.deterministic(cpu, False) is False
    set_to = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", set_to.append)
    devices.matmul_precision(gpu, None)
    devices.matmul_precision(gpu, False)
    devices.matmul_precision(cpu, None)
    assert set_to == ["high", "highest"]


def test_the_optimiser_is_fused_where_torch_has_the_kernel_and_steps_as_the_loop_does():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    loop = torch.nn.Linear(4, 4)
    loop.load_state_dict(model.state_dict())
    for name in ("adamw", "adam", "sgd"):
        opt, _ = make_optimizer(model, TrainConfig(optimizer=name))
        assert opt.defaults.get("fused"), name  # the CPU has the fused kernels
    opt, _ = make_optimizer(model, TrainConfig(warmup_steps=0))  # the schedule's factor at step 0: 1
    reference = torch.optim.AdamW([{"params": [loop.weight], "weight_decay": 0.01},
                                   {"params": [loop.bias], "weight_decay": 0.0}], lr=1e-3, foreach=False)
    for _ in range(3):
        x = torch.randn(8, 4)
        for m, o in ((model, opt), (loop, reference)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    assert torch.equal(model.weight, loop.weight) and torch.equal(model.bias, loop.bias)
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 4)
    assert not use_fused(list(meta.parameters()))

    class OnGpu:  # what use_fused reads of a parameter
        device = torch.device("cuda", 0)

        @staticmethod
        def is_floating_point() -> bool:
            return True

    assert use_fused([OnGpu(), OnGpu()]) and not use_fused([])


def test_device_tags_name_the_gpu_capability_cuda_and_driver(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        version if str(path) == "/proc/driver/nvidia/version" else path, *a, **k))
    tags = devices.device_tags(torch.device("cuda", 0))
    assert tags == {Tag.DEVICE: "NVIDIA H100 80GB HBM3", Tag.DEVICE_CAPABILITY: "9.0",
                    Tag.CUDA_VERSION: "12.4", Tag.DRIVER_VERSION: "550.54.15"}
    cpu = devices.device_tags(torch.device("cpu"))
    assert list(cpu) == [Tag.DEVICE] and cpu[Tag.DEVICE].startswith("cpu: ")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_step_never_waits(monkeypatch):  # pragma: no cover - GPU only
    system, batch = lm_system(batch_size=8)
    system = system.cuda()
    batch = {k: v.cuda() for k, v in batch.items()}
    torch.cuda.set_sync_debug_mode("error")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(3):
                system.training_step(batch, i).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_benchmark_records_name_the_gpu_capability_cuda_and_driver(monkeypatch):
    from types import SimpleNamespace

    from harness.bench.common import machine

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setattr(devices, "driver_version", lambda: "560.35.03")
    line = machine("cuda")
    assert "GPU NVIDIA H200 (141 GiB, compute capability 9.0), CUDA 12.6, driver 560.35.03" in line
