"""``harness bench gpu`` (harness.bench.gpu) without a GPU: it refuses a real run (exit 2), and
its dry run exercises every section at tiny shapes on the CPU, the FLA columns saying why
they are empty. The figures it exists for need a GPU (docs/performance.md)."""

from __future__ import annotations

import json

import pytest
import torch
from text import flat

from harness.bench import gpu
from harness.cli import main as cli


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_the_gpu_benchmark_exits_2_saying_why(capsys):
    assert cli.main(["bench", "gpu", "--output", "-"]) == 2
    err = flat(capsys.readouterr().err)
    assert "needs a CUDA device" in err and "--dry-run" in err and "Traceback" not in err


def test_the_dry_run_measures_each_layer_and_marks_the_missing_kernels(tmp_path):
    settings = gpu.dry_run_settings(("mixers", "attention"), ("gla", "mamba"))
    seen: list[gpu.Row] = []
    rows = gpu.benchmark(settings, str(tmp_path), seen.append)
    assert rows == seen
    by = {(r.name, r.implementation.split(" (")[0], r.length): r for r in rows}
    gla = by[("mixer:gla", "reference", 64)]
    assert gla.status == "ok" and gla.tokens_per_s > 0 and gla.ms > 0
    assert by[("mixer:gla", "fla", 64)].status == gpu.NO_CUDA
    assert by[("mixer:gla", "fla layer", 64)].status == gpu.NO_CUDA
    mamba = by[("mixer:mamba", "reference implementation", 64)]  # no kernel for mamba-1 here
    assert mamba.status == "ok" and ("mixer:mamba", "fla", 64) not in by
    assert by[("mixer:mamba", "fla layer", 64)].status == "n/a: no FLA layer"
    for length in (64, 128):
        assert by[("torch.sdpa", "PyTorch SDPA", length)].status == "ok"
        assert by[("attention:multi_head", "harness", length)].tokens_per_s > 0
    tags = gpu.device_tags("cpu")
    text = gpu.markdown(settings, rows, tags, "# head\n\n")
    assert gpu.NO_CUDA in text and "driver" in text
    assert all({"gpu", "cuda", "driver"} <= set(r) for r in gpu.records(rows, tags))


@pytest.mark.slow
def test_the_dry_run_command_writes_a_record_with_every_section(tmp_path, harness_home, capsys):
    out = tmp_path / "gpu_dry.md"
    assert cli.main(["bench", "gpu", "--dry-run", "--output", str(out)]) == 0
    text = out.read_text()
    for section in gpu.SECTIONS:
        assert f"| {section} |" in text
    assert "| transformer | transformer (tiny) | plain PyTorch |" in text
    records = json.loads(out.with_suffix(".json").read_text())
    assert {r["section"] for r in records} == set(gpu.SECTIONS)
    assert all(r["gpu"] == "none (CPU dry run)" for r in records)
