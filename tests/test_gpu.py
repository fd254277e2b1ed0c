"""On a CUDA GPU: the code paths the CPU tests reach with the device as a parameter
(tests/test_cost_devices.py), now on the real device. Skipped cleanly without CUDA;
``nox -s gpu`` runs them (and the GPU benchmarks) on a GPU machine."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.keys import Metric
from harness.runtime import devices

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]

RUN = {"task": {"name": "copy", "params": {"length": 8, "vocab": 8, "num_train": 256, "num_val": 32}},
       "model": {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 32},
                 "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
       "train": {"max_steps": 20, "batch_size": 16, "val_every": 10, "progress": False,
                 "accelerator": "gpu", "devices": 1},
       "tracking": {"experiment": "gpu-test"}}


def test_a_run_on_the_gpu_logs_its_cost_in_bf16() -> None:
    import harness

    result = harness.train(copy.deepcopy(RUN))
    m = result.metrics
    assert result.status == "FINISHED"
    assert m[Metric.PEAK_GPU_MB] > 0 and Metric.PEAK_TENSOR_MB not in m
    assert m[Metric.TOKENS_PER_S] > 0 and m[Metric.FLOPS_PER_TOKEN] > 0
    expected_mfu = devices.mfu(m[Metric.FLOPS_PER_TOKEN], m[Metric.TOKENS_PER_S], torch.device("cuda", 0))
    if expected_mfu is None:  # a GPU the peak table does not know: no MFU rather than a guess
        assert Metric.MFU not in m
    else:
        assert m[Metric.MFU] == pytest.approx(expected_mfu, rel=1e-6) and 0 < m[Metric.MFU] < 1
    if torch.cuda.is_bf16_supported():
        assert result.config["train"]["precision"] in ("auto", "bf16-mixed")


def test_the_peak_table_knows_the_h100_and_h200_when_they_are_here() -> None:
    name = torch.cuda.get_device_name(0)
    row = devices.peak_for(name)
    if "H100" in name or "H200" in name:
        assert row is not None and row.bf16_tflops in (756.0, 989.0)


def test_compiled_training_on_the_gpu_finishes() -> None:
    import harness

    cfg = copy.deepcopy(RUN)
    cfg["train"]["compile"] = True
    assert harness.train(cfg).status == "FINISHED"
