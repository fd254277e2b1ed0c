"""The model's own peak memory on the CPU (``cost/peak_tensor_mb``): storages counted once,
freed ones subtracted, and a model whose step holds a known extra tensor reports exactly that
much more than the same model without it."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from cost_models import BigramPlugin

import harness
from harness.keys import Metric
from harness.runtime.memory import TensorMemory

MiB = 2**20


def test_the_meter_counts_what_is_alive_and_its_peak():
    base = torch.zeros(1024)  # 4 KiB alive before
    meter = TensorMemory()
    meter.add([base, base[:10]])  # a view shares the storage: counted once
    assert meter.current == 4096
    with meter:
        a = torch.ones(MiB // 4)  # 1 MiB
        b = a * 2  # 1 MiB more: 2 MiB + 4 KiB at the peak
        view = b[:100]
        del a
        gc.collect()
        c = torch.empty(MiB // 8)  # 0.5 MiB while b lives (a freed): below the peak
        assert meter.current == 4096 + MiB + MiB // 2
        del b
        assert meter.current == 4096 + MiB + MiB // 2  # b's storage lives on through its view
        del view, c
    assert meter.peak == 4096 + 2 * MiB
    assert meter.current == 4096


def test_in_place_operations_and_other_devices_add_nothing():
    meter = TensorMemory("cpu")
    x = torch.zeros(256)
    meter.add([x, torch.zeros(8, device="meta")])
    with meter:
        x.add_(1).mul_(3)
        torch.empty(1024, device="meta")
    assert meter.peak == meter.current == 1024


@pytest.fixture(scope="module")
def reg():
    return harness.load_plugins(plugins=[BigramPlugin()])


def bigram_run(reg: Any, **params: Any) -> dict[str, float]:
    cfg = {"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16}},
           "model": {"name": "bigram", "params": params},
           "train": {"max_steps": 3, "batch_size": 8, "val_every": 3, "progress": False,
                     "log_attention": False, "accelerator": "cpu", "num_threads": 1}}
    return harness.train(cfg, registry=reg).metrics


def test_a_step_holding_an_extra_mebibyte_reports_one_mebibyte_more(reg):
    plain = bigram_run(reg)
    extra = bigram_run(reg, extra_kib=1024)
    assert plain[Metric.PEAK_TENSOR_MB] > 0
    assert extra[Metric.PEAK_TENSOR_MB] - plain[Metric.PEAK_TENSOR_MB] == pytest.approx(1.0, abs=1e-6)
    assert Metric.PEAK_GPU_MB not in plain  # a CPU run has no allocator figure
