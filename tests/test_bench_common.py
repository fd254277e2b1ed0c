"""The benchmarks' shared machinery: growth fits, extrapolation, records that never overwrite."""

from __future__ import annotations

from datetime import datetime

import pytest

from harness.bench import common
from harness.errors import HarnessError


@pytest.mark.parametrize("exponent", [0.0, 1.0, 1.5, 2.0])
def test_loglog_slope_recovers_a_power_law(exponent):
    points = [(n, 3.0 * n**exponent) for n in (256, 512, 1024, 4096)]
    assert common.loglog_slope(points) == pytest.approx(exponent)


def test_loglog_slope_needs_two_distinct_positive_points():
    assert common.loglog_slope([(256, 1.0)]) is None
    assert common.loglog_slope([(256, 1.0), (256, 2.0)]) is None
    assert common.loglog_slope([(256, 1.0), (512, 0.0)]) is None  # a zero has no logarithm


def test_extrapolate_follows_the_last_growth_within_bounds():
    assert common.extrapolate([], 1024) is None
    assert common.extrapolate([(256, 1.0)], 1024) == pytest.approx(16.0)  # hi = 2 from one point
    assert common.extrapolate([(256, 1.0), (512, 2.0)], 2048) == pytest.approx(8.0)  # linear
    assert common.extrapolate([(256, 1.0), (512, 16.0)], 1024, hi=3.0) == pytest.approx(128.0)  # clamped to 3
    assert common.extrapolate([(256, 2.0), (512, 1.0)], 1024) == pytest.approx(2.0)  # shrinking: lo = 1


def test_records_are_new_dated_files_and_never_overwrite(tmp_path):
    day = datetime(2026, 11, 22, 9, 30)
    first = common.record_path(None, "model", "cpu", day, directory=str(tmp_path))
    assert first == tmp_path / "model_cpu_2026-11-22.md"
    first.write_text("kept")
    second = common.record_path(None, "model", "cpu", day, directory=str(tmp_path))
    assert second == tmp_path / "model_cpu_2026-11-22-2.md"
    assert common.record_path("-", "model", "cpu", day) is None
    with pytest.raises(HarnessError, match="never overwrite"):
        common.record_path(str(first), "model", "cpu", day)
    assert first.read_text() == "kept"


def test_peak_rss_counts_what_a_call_allocates():
    import torch

    _, mb = common.peak_rss_mb(lambda: torch.ones(64 * 2**20 // 4).sum())  # 64 MB touched
    assert 48 < mb < 200


def test_header_names_machine_command_and_load():
    text = common.header("T", device="cpu", command="harness bench x", started=datetime(2026, 1, 2),
                         seconds=90, load_before="load average 1", load_after="load average 2")
    assert text.startswith("# T\n") and "CPU " in text and "torch " in text
    assert "`harness bench x`" in text and "1.5 min" in text and "load average 2" in text


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0])
def test_decode_growth_slope_sees_through_the_constant_cost_of_a_call(exponent):
    """Per-token time = a constant (projections, MLPs, the call) + b * context^p: the plain
    log-log slope reads far below p while the constant dominates; the growth slope recovers p."""
    from harness.bench.decode import growth_slope

    contexts = [256, 1024, 4096, 16384]
    b = 0.3 / 4096 ** exponent  # the growing part is 0.3 ms at 4096: the constant 0.35 ms dominates
    points = [(c, 0.35 + b * c ** exponent) for c in contexts]
    assert common.loglog_slope(points[1:]) < 0.8 * exponent
    assert growth_slope(points, fit_from=1024) == pytest.approx(exponent, abs=0.05)


def test_decode_growth_slope_is_zero_for_a_flat_time_and_plain_without_a_base_context():
    from harness.bench.decode import growth_slope

    flat = [(256, 0.50), (1024, 0.52), (4096, 0.49), (16384, 0.53)]  # jitter, no growth
    assert growth_slope(flat, fit_from=1024) == 0.0
    no_base = [(1024, 1.0), (4096, 4.0)]
    assert growth_slope(no_base, fit_from=1024) == pytest.approx(common.loglog_slope(no_base))
