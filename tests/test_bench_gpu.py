"""``harness bench gpu`` (harness.bench.gpu) without a GPU: it refuses a real run (exit 2), and
its dry run exercises every section at tiny shapes on the CPU, the FLA columns saying why
they are empty. The figures it exists for need a GPU (docs/performance.md)."""

from __future__ import annotations

import json
import sys

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


def tiny_tests(folder) -> str:
    path = folder / "test_tiny_gpu_proof.py"
    path.write_text("def test_passes():\n    assert True\n\n\ndef test_fails():\n    assert 1 == 2, 'planted'\n")
    return str(path)


def test_the_time_boxed_proof_writes_each_section_as_it_ends_and_names_what_it_skipped(
        tmp_path, harness_home, monkeypatch):
    """The dry run of `harness bench gpu --deadline`: the environment first, the tests section
    (a planted failure recorded, not fatal), the mixers in a process of their own; the
    attention, transformer and decode sections here made to need more time than is left, so
    each is skipped and named (their dry run: the slow test below)."""
    from harness.bench import proof

    monkeypatch.setattr(proof, "BUDGET", {**proof.BUDGET, "attention": (50.0, 10_000.0),
                                          "transformer": (110.0, 10_000.0), "decode": (45.0, 10_000.0)})
    records = tmp_path / "out" / "proof"
    outcomes = proof.run(records, 600.0, [tiny_tests(tmp_path)], 60.0, dry_run=True, say=lambda _line: None)
    assert [(o.section, o.status.split(":")[0]) for o in outcomes] == [
        ("tests", "done"), ("mixers", "done"), ("attention", "skipped"), ("transformer", "skipped"),
        ("decode", "skipped")]
    assert sorted(p.name for p in records.iterdir()) == ["proof.jsonl", "proof.md", "tests.xml"]  # <= 8 files
    text = records.joinpath("proof.md").read_text()
    assert text.index("## Environment") < text.index("## tests") < text.index("## mixers") < text.index("## Summary")
    assert "| torch |" in text and "| triton |" in text and "| fla-core |" in text and "| load |" in text
    assert "## tests: 1 passed, 1 failed" in text and "planted" in text
    assert "| mixers | mixer:retnet | reference | 64 |" in text and gpu.NO_CUDA in text
    assert "Skipped: attention (" in " ".join(text.split()) and "it needs at least 10000 s" in text
    lines = [json.loads(line) for line in records.joinpath("proof.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "environment" and lines[-1] == {
        "event": "end", "seconds": lines[-1]["seconds"], "skipped": ["attention", "transformer", "decode"]}
    rows = [r for r in lines if r.get("section") == "mixers" and "event" not in r]
    assert {r["name"] for r in rows} == {"mixer:gla", "mixer:retnet"} and all(r["gpu"] for r in rows)


def test_a_section_over_its_cap_is_stopped_and_its_finished_rows_kept(tmp_path, monkeypatch):
    from harness.bench import proof

    def slow_bench(records, section, dry_run, timeout):
        records.event(section=section, name="mixer:gla", implementation="reference", length=64, status="ok",
                      tokens_per_s=1.0, ms=1.0, peak_mb=0.0, extra={})
        return proof.run_group([sys.executable, "-c", "import time; time.sleep(60)"], timeout)

    monkeypatch.setattr(proof, "bench_section", slow_bench)
    monkeypatch.setattr(proof, "DRY_SLACK", 1.0)
    monkeypatch.setattr(proof, "BUDGET", {**proof.BUDGET, "mixers": (2.0, 1.0), "attention": (50.0, 10_000.0),
                                          "transformer": (110.0, 10_000.0), "decode": (45.0, 10_000.0)})
    outcomes = proof.run(tmp_path / "r", 600.0, [], 60.0, dry_run=True, say=lambda _line: None)
    assert outcomes[0].status == "skipped: no --tests given"
    assert outcomes[1].status == "stopped at its cap (2 s)" and outcomes[1].seconds < 30
    assert "| mixers | mixer:gla | reference | 64 | 1 |" in (tmp_path / "r" / "proof.md").read_text()


def test_the_deadline_needs_a_records_folder_never_overwritten(tmp_path, capsys):
    assert cli.main(["bench", "gpu", "--dry-run", "--deadline", "10"]) == 2
    assert "--deadline needs --records" in " ".join(capsys.readouterr().err.split())
    (tmp_path / "proof.md").write_text("kept")
    assert cli.main(["bench", "gpu", "--dry-run", "--deadline", "10", "--records", str(tmp_path)]) == 2
    assert "already holds proof.md" in " ".join(capsys.readouterr().err.split())
    assert (tmp_path / "proof.md").read_text() == "kept"


@pytest.mark.slow
def test_the_whole_dry_run_proof_runs_every_section(tmp_path, harness_home):
    records = tmp_path / "proof"
    assert cli.main(["bench", "gpu", "--dry-run", "--deadline", "2000", "--records", str(records),
                     "--tests", tiny_tests(tmp_path)]) == 0
    text = records.joinpath("proof.md").read_text()
    for section in ("tests", "mixers", "attention", "transformer", "decode"):
        assert f"## {section}: " in text
    assert "| transformer | transformer (tiny) | plain PyTorch |" in text
