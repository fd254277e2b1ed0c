"""``harness bench mixer`` and ``harness bench decode``: measured growth against the declared
complexity, one measurement of each kind in-process, and the commands end to end at toy sizes
(not timed tests: only that they measure, fit and record)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.bench import attention, decode, mixer
from harness.cli import main as cli
from harness.registry.loader import load

REGISTRY = load()


@pytest.mark.parametrize("expr, exponent", [("L^2", 2.0), ("L", 1.0), ("L log L", 1.1), ("1", 0.0)])
def test_declared_exponents(expr, exponent):
    assert mixer.declared_exponent(expr) == pytest.approx(exponent)


def passes(name, exponent_time, exponent_memory):
    return [attention.Measurement(name, n, ms=n**exponent_time / 1e3, peak_mb=n**exponent_memory / 1e4,
                                  causal=True) for n in (1024, 2048, 4096)]


def points(arch, exponent):
    return [decode.Point(arch, n, ms_per_token=0.5 * n**exponent, state_mb=1e-3 * n**exponent)
            for n in (1024, 2048, 4096)]


def test_compare_flags_only_slopes_far_from_the_declaration():
    measured = passes("attention:multi_head", 2.0, 1.0) + passes("mixer:mamba", 1.0, 2.0)
    decoded = points("attention:multi_head", 1.0) + points("mixer:mamba", 0.0)
    rows = {r.name: r for r in mixer.compare(REGISTRY, measured, decoded, fit_from=1024)}
    mha, mamba = rows["attention:multi_head"], rows["mixer:mamba"]
    assert mha.measured["time"] == pytest.approx(2.0) and mha.measured["decode"] == pytest.approx(1.0)
    assert mha.flags(0.35) == []
    assert mamba.flags(0.35) == ["memory: declared L, measured L^2.00"]  # mamba declares linear memory
    text = "\n".join(mixer.summary_rows(list(rows.values()), 0.35))
    assert "| mixer:mamba | causal | L | 1.00 | L | 2.00 | 1 | 0.00 | memory: declared L" in text


def test_decode_slopes_separate_attention_from_recurrent_state():
    s = decode.slopes(points("a", 1.0) + points("b", 0.0), fit_from=2048)
    assert s["a"]["time"] == pytest.approx(1.0) and s["b"]["state"] == pytest.approx(0.0)


def job(variant, length=32, **changes):
    settings = attention.Settings(batch=1, d_model=16, heads=2, min_time_s=0.0, either_direction=True)
    return {**dataclasses.asdict(dataclasses.replace(settings, **changes)), "variant": variant, "length": length}


def test_one_mixer_pass_is_measured_like_attention():
    result = attention.measure(job("mixer:mamba"))
    assert result["ms"] > 0 and result["peak_mb"] >= 0 and result["causal"] is True


def test_a_bidirectional_only_layer_runs_bidirectionally_at_any_length():
    result = attention.measure(job("attention:linformer", length=300))  # past its default max_length 256
    assert result["causal"] is False and result["ms"] > 0


def test_one_decoding_point():
    settings = decode.Settings(d_model=16, layers=1, heads=2, new_tokens=3)
    result = decode.measure({**dataclasses.asdict(settings), "arch": "attention:multi_head", "context": 20})
    assert result["ms_per_token"] > 0 and result["prefill_s"] > 0
    # keys and values of 20 + 3 + 3 positions (prefill, untimed and timed generation), 1 layer
    assert result["state_mb"] * 2**20 == pytest.approx(2 * 26 * 16 * 4)


@pytest.mark.slow
def test_bench_mixer_command_fits_and_records(tmp_path, capsys):
    out = tmp_path / "mixers.md"
    code = cli.main(["bench", "mixer", "--device", "cpu", "--lengths", "16", "32", "--contexts", "8", "16",
                     "--fit-from", "8", "--batch", "1", "--d-model", "8", "--heads", "2", "--new-tokens", "2",
                     "--only", "retnet", "--min-time", "0", "--output", str(out)])
    assert code == 0
    text = out.read_text()
    assert "## Declared against measured growth" in text and "Machine load" in text
    assert len([line for line in text.splitlines() if line.startswith("| mixer:retnet | causal |")]) == 1
    assert "| torch.sdpa | 2 | 32 |" in text and "| mixer:retnet | 16 |" in text
    assert str(out) in capsys.readouterr().out


@pytest.mark.slow
def test_bench_decode_command_records_every_point(tmp_path):
    out = tmp_path / "decode.md"
    code = cli.main(["bench", "decode", "--device", "cpu", "--contexts", "8", "16", "--fit-from", "8",
                     "--d-model", "8", "--layers", "1", "--heads", "2", "--new-tokens", "2",
                     "--only", "linear", "gru", "--output", str(out)])
    assert code == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith(("| attention:linear |",
                                                                              "| model:gru |"))]
    assert len(rows) == 2 + 4  # one slope row and two points each


def test_unknown_architecture_is_a_user_error(capsys):
    assert cli.main(["bench", "decode", "--only", "multihead", "--output", "-"]) == 2
    assert "multi_head" in capsys.readouterr().err
