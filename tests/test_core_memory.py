"""The process-level resident peak is measured per run: a later, smaller run in the same
process reports less (the model's own peak is tested in tests/test_cost_memory.py)."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.runtime.memory import PeakMemory, reset_peak_rss

pytestmark = pytest.mark.skipif(not reset_peak_rss(), reason="needs /proc/self/clear_refs (Linux)")


def test_peak_is_per_run_not_per_process():
    cpu = torch.device("cpu")
    with PeakMemory(cpu) as big:
        block = torch.ones(64, 2**20)  # 256 MiB, touched
        del block
    gc.collect()
    with PeakMemory(cpu) as small:
        block = torch.ones(4, 2**20)  # 16 MiB
        del block
    b, s = big.metrics(), small.metrics()
    assert "cost/peak_gpu_mem_mb" not in b  # no allocator statistics on the CPU
    assert s["cost/process_peak_rss_mb"] < b["cost/process_peak_rss_mb"] - 150  # ru_maxrss could never drop
