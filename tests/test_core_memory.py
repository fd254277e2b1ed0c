"""Peak memory is measured per run: a later, smaller run in the same process reports less."""

from __future__ import annotations

import gc
import time

import pytest
import torch

from harness.memory import PeakMemory, resident_mb

pytestmark = pytest.mark.skipif(resident_mb() is None, reason="needs /proc/self/statm (Linux)")


def test_peak_is_per_run_not_per_process():
    cpu = torch.device("cpu")
    with PeakMemory(cpu) as big:
        block = torch.ones(64, 2**20)  # 256 MiB, touched
        time.sleep(0.05)
        del block
    gc.collect()
    with PeakMemory(cpu) as small:
        block = torch.ones(4, 2**20)  # 16 MiB
        time.sleep(0.05)
        del block
    b, s = big.metrics(), small.metrics()
    assert b["cost/peak_rss_increase_mb"] > 200
    assert s["cost/peak_rss_increase_mb"] < 100
    assert s["cost/peak_rss_mb"] < b["cost/peak_rss_mb"] - 150  # ru_maxrss could never drop
