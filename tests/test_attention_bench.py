"""The attention benchmark: one measurement in-process, size skipping, and the command end to
end at a toy size (it is not a timed test: only that it measures and records)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from text import flat

from harness.bench import attention as bench
from harness.cli import main as cli


def job(variant: str, length: int = 24) -> dict:
    settings = bench.Settings(batch=1, d_model=8, heads=2, min_time_s=0.0)
    return {**dataclasses.asdict(settings), "variant": variant, "length": length}


@pytest.mark.parametrize("variant", ["linear", *bench.BASELINES])
def test_one_measurement_reports_time_memory_and_heads(variant):
    result = bench.measure(job(variant))
    assert result["ms"] > 0 and result["passes"] >= 1
    assert result["peak_mb"] >= 0
    assert result["heads"] == 2


def test_memory_estimate_extrapolates_the_observed_growth():
    def point(length, mb):
        return bench.Measurement("v", length, peak_mb=mb)

    assert bench.estimate_gb([], 1024) is None
    assert bench.estimate_gb([point(256, 10.0)], 1024) == pytest.approx(160 / 1024)  # quadratic
    linear = [point(256, 10.0), point(1024, 40.0)]
    assert bench.estimate_gb(linear, 4096) == pytest.approx(160 / 1024)
    steeper = [point(256, 1.0), point(512, 8.0)]  # cubic growth is clamped to quadratic
    assert bench.estimate_gb(steeper, 1024) == pytest.approx(32 / 1024)


@pytest.mark.slow
def test_bench_attention_command_prints_and_records_a_table(tmp_path, capsys):
    out = tmp_path / "attention_cpu.md"
    code = cli.main(["bench", "attention", "--device", "cpu", "--lengths", "16", "1000000",
                     "--batch", "1", "--d-model", "8", "--heads", "2", "--variants", "sliding_window",
                     "--min-time", "0", "--max-memory-gb", "1", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    text = out.read_text()
    assert "CPU " in text and "torch " in text and "Date:" in text and "Peak memory:" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "variant" not in line]
    names = [row.split("|")[1].strip() for row in rows]
    assert names == ["torch.sdpa", "torch.sdpa", "torch.nn.MultiheadAttention",
                     "torch.nn.MultiheadAttention", "sliding_window", "sliding_window"]
    measured = [row for row in rows if "| 16 |" in row]
    skipped = [row for row in rows if "| 1000000 |" in row]
    assert all(row.count("|") == 12 for row in rows)
    assert all("skipped (est." in row for row in skipped)
    ratio = measured[-1].split("|")[7].strip()  # speed × SDPA of sliding_window
    assert float(ratio) > 0
    assert "sliding_window" in printed and str(out) in printed


def test_unknown_variant_is_a_user_error(capsys):
    assert cli.main(["bench", "attention", "--variants", "multihead", "--out", "-"]) == 2
    assert "multi_head" in capsys.readouterr().err


def test_bench_never_overwrites_a_recorded_file(tmp_path, monkeypatch, capsys):
    from datetime import datetime

    from harness.bench.common import record_path

    record = tmp_path / "attention_cpu.md"
    record.write_text("recorded\n")
    assert cli.main(["bench", "attention", "--device", "cpu", "--output", str(record)]) == 2
    assert "never overwrite" in flat(capsys.readouterr().err) and record.read_text() == "recorded\n"
    day = datetime(2026, 11, 23)
    assert record_path("-", "attention", "cpu", day) is None
    monkeypatch.chdir(tmp_path)
    first = record_path(None, "attention", "cpu", day)
    assert first == Path("benchmarks/attention_cpu_2026-11-23.md")
    first.parent.mkdir()
    first.write_text("x")
    assert record_path(None, "attention", "cpu", day) == Path("benchmarks/attention_cpu_2026-11-23-2.md")
