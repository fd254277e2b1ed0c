"""``harness bench gpu`` (harness.bench.gpu) without a GPU: it refuses a real run (exit 2), and
its dry run exercises every section at tiny shapes on the CPU, the FLA columns saying why
they are empty. The figures it exists for need a GPU (docs/performance.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    # issue 51's tiny shape eager beside the plain loop, and the CUDA-graph row, which needs CUDA
    small = {(r["implementation"], r["status"]) for r in json.loads(out.with_suffix(".json").read_text())
             if r["name"].startswith("transformer d32 x 2")}
    assert small == {("harness", "ok"), ("plain PyTorch", "ok"), ("harness, train.cuda_graphs", gpu.NO_CUDA)}
    records = json.loads(out.with_suffix(".json").read_text())
    assert {r["section"] for r in records} == set(gpu.SECTIONS)
    assert all(r["gpu"] == "none (CPU dry run)" for r in records)


def tiny_tests(folder) -> str:
    path = folder / "test_tiny_gpu_proof.py"
    path.write_text("def test_passes():\n    assert True\n\n\ndef test_fails():\n    assert 1 == 2, 'planted'\n")
    return str(path)


def test_the_time_boxed_proof_writes_each_section_as_it_ends_and_names_what_it_skipped(
        tmp_path, harness_home, monkeypatch):
    """The dry run of `harness bench gpu --deadline`: the environment and the node's package
    list first, the ceiling, the mixers in a process of their own, the tests section (a planted
    failure recorded, not fatal); the transformer, attention, decode and small sections here made to
    need more time than is left, so each is skipped and named (their dry run: the slow test)."""
    from harness.bench import proof

    monkeypatch.setattr(proof, "BUDGET", {**proof.BUDGET, "attention": (50.0, 10_000.0),
                                          "transformer": (110.0, 10_000.0), "decode": (45.0, 10_000.0),
                                          "small": (60.0, 10_000.0)})
    records = tmp_path / "out" / "proof"
    outcomes = proof.run(records, 600.0, [tiny_tests(tmp_path)], 60.0, dry_run=True, say=lambda _line: None,
                         commit="0123abc")
    assert [(o.section, o.status.split(":")[0]) for o in outcomes] == [
        ("ceiling", "done"), ("transformer", "skipped"), ("attention", "skipped"), ("mixers", "done"),
        ("tests", "done"), ("decode", "skipped"), ("small", "skipped")]
    assert sorted(p.name for p in records.iterdir()) == ["freeze.txt", "proof.jsonl", "proof.md", "tests.xml"]
    freeze = records.joinpath("freeze.txt").read_text()
    assert f"torch=={torch.__version__.split('+')[0]}" in freeze.replace("+cpu", "")
    text = records.joinpath("proof.md").read_text()
    assert (text.index("## Environment") < text.index("## ceiling") < text.index("## mixers")
            < text.index("## tests") < text.index("## Summary"))
    assert "| torch |" in text and "| triton |" in text and "| fla-core |" in text and "| load |" in text
    assert "| git_commit | 0123abc |" in text and "| node_packages |" in text
    assert "## tests: 1 passed, 1 failed" in text and "planted" in text
    assert "| mixers | mixer:retnet | reference | 64 |" in text and gpu.NO_CUDA in text
    assert "Skipped: transformer (" in " ".join(text.split()) and "it needs at least 10000 s" in text
    lines = [json.loads(line) for line in records.joinpath("proof.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "environment" and lines[-1] == {
        "event": "end", "seconds": lines[-1]["seconds"], "skipped": ["transformer", "attention", "decode", "small"]}
    ceiling = [r for r in lines if r.get("section") == "ceiling" and "event" not in r]
    assert len(ceiling) == 1 and ceiling[0]["extra"]["flops_per_s"] > 0
    rows = [r for r in lines if r.get("section") == "mixers" and "event" not in r]
    assert {r["name"] for r in rows} == {"mixer:gla", "mixer:retnet"} and all(r["gpu"] for r in rows)
    # one length for every mixer before the next; each mixer's three measurements in turn
    assert [(r["name"], r["implementation"].split(" (")[0]) for r in rows] == [
        (f"mixer:{m}", kind) for m in ("gla", "retnet") for kind in ("reference", "fla", "fla layer")]


def test_a_section_over_its_cap_is_stopped_and_its_finished_rows_kept(tmp_path, monkeypatch):
    from harness.bench import proof

    def slow_bench(records, section, dry_run, timeout, env=None):
        records.event(section=section, name="mixer:gla", implementation="reference", length=64, status="ok",
                      tokens_per_s=1.0, ms=1.0, peak_mb=0.0, extra={})
        return proof.run_group([sys.executable, "-c", "import time; time.sleep(60)"], timeout)

    monkeypatch.setattr(proof, "bench_section", slow_bench)
    monkeypatch.setattr(proof, "DRY_SLACK", 1.0)
    monkeypatch.setattr(proof, "BUDGET", {"ceiling": (2.0, 1.0), "transformer": (110.0, 10_000.0)})
    outcomes = proof.run(tmp_path / "r", 600.0, [], 60.0, dry_run=True, say=lambda _line: None)
    assert outcomes[0].status == "stopped at its cap (2 s)" and outcomes[0].seconds < 30
    assert "| ceiling | mixer:gla | reference | 64 | 1 |" in (tmp_path / "r" / "proof.md").read_text()


def test_a_section_hears_sigint_even_when_the_proof_was_started_with_it_ignored():
    """A background job of a script starts with SIGINT ignored, and an ignored signal stays
    ignored in its children: the section's processes get Python's own handler back."""
    import signal

    from harness.bench import proof

    check = "import signal, sys; sys.exit(0 if signal.getsignal(signal.SIGINT) is signal.default_int_handler else 3)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code, _ = proof.run_group([sys.executable, "-c", check], 60.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 0


def test_tests_stopped_at_their_cap_are_interrupted_so_junit_names_those_that_ran(tmp_path, monkeypatch):
    """At the cap pytest gets SIGINT first and writes its JUnit file (the tests that finished,
    named), then SIGKILL if it lingers; before, SIGKILL alone left no file."""
    from harness.bench import proof

    path = tmp_path / "test_slow_gpu_proof.py"
    path.write_text("import time\n\n\ndef test_quick():\n    assert True\n\n\n"
                    "def test_sleeps():\n    time.sleep(120)\n")
    monkeypatch.setattr(proof, "BUDGET", {"tests": (25.0, 1.0)})
    monkeypatch.setattr(proof, "DRY_SLACK", 1.0)
    outcomes = proof.run(tmp_path / "r", 600.0, [str(path)], 600.0, dry_run=True, say=lambda _line: None)
    assert outcomes[0].status == "stopped at its cap (25 s)" and outcomes[0].seconds < 25 + proof.SIGINT_GRACE_S + 15
    results = proof.junit_results(tmp_path / "r" / "tests.xml")
    assert {r["test"].split("::")[-1]: r["outcome"] for r in results}.get("test_quick") == "passed"
    assert "stopped at its cap by SIGINT" in (tmp_path / "r" / "proof.md").read_text()


def test_quiet_pauses_the_warmers_process_groups_and_resumes_them(monkeypatch):
    """What a section does while it times the GPU: the warmers' groups stopped, then continued."""
    import subprocess

    from harness.bench import proof

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        monkeypatch.setenv(proof.QUIET_ENV, f"{child.pid},999999999")  # a group that is gone is ignored

        def state(wanted: set[str]) -> str:  # signals arrive asynchronously: wait for it
            import time

            for _ in range(100):
                now = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if now in wanted:
                    break
                time.sleep(0.05)
            return now

        with proof.quiet():
            assert state({"T"}) == "T"  # stopped
        assert state({"S", "R"}) in ("S", "R")
    finally:
        child.kill()
        child.wait()


def test_a_warmer_marks_its_shapes_done_and_says_what_it_compiled(tmp_path):
    """Without CUDA the warmer has nothing to compile: it says why, ends and still marks the
    mixers' shapes done, so a proof never waits on it."""
    import subprocess

    done = tmp_path / "0.mixers"
    out = subprocess.run([sys.executable, "-m", "harness.bench.warm", "--slice", "0/2", "--mixers", "gla",
                          "--lengths", "64", "--done", str(done)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert done.exists() and "warm 0/2: no CUDA device here, nothing to compile" in out.stdout


TOY_KERNEL = """
import sys
import torch, triton, triton.language as tl
from harness.bench import autotune

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32) for w in (1, 2)]

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

index, count = map(int, sys.argv[1:3])
stats = autotune.precompile_slice(index, count)
n = int(sys.argv[3])
x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
for _ in range(2):  # the second call with the same key compiles nothing more
    add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
print(stats["compiled"], stats["keys"], bool(torch.allclose(out, x + y)))
"""


def test_warmers_share_out_every_configuration_once_and_still_compute(tmp_path):
    """harness.bench.autotune.precompile_slice on real Triton (its interpreter, on the CPU):
    three warmers compile disjoint shares of the kernel's four configurations, together all of
    them, each only once per key, and the call still computes its result (one configuration)."""
    import os
    import subprocess

    pytest.importorskip("triton")
    script = tmp_path / "toy.py"
    script.write_text(TOY_KERNEL)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    counts = []
    for index in range(3):
        out = subprocess.run([sys.executable, str(script), str(index), "3", "100"], capture_output=True,
                             text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        compiled, keys, correct = out.stdout.split()[-3:]
        assert keys == "1" and correct == "True"
        counts.append(int(compiled))
    assert counts == [2, 1, 1]  # configurations 0 and 3, 1, 2: four in all, none twice


def test_an_autotune_slice_is_index_over_count():
    from harness.bench import autotune

    assert autotune.parse_slice("3/8") == (3, 8)
    for bad in ("8/8", "-1/4", "a/b", "3"):
        with pytest.raises(ValueError, match="HARNESS_AUTOTUNE_SLICE"):
            autotune.parse_slice(bad)


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
    for section in ("ceiling", "transformer", "attention", "mixers", "tests", "decode"):
        assert f"## {section}: " in text
    assert "harness (first step)" in text and "graphs compiled after the first step" in text
    assert "| transformer | transformer (tiny) | plain PyTorch |" in text


def test_time_a_section_leaves_unused_goes_to_the_next(tmp_path, monkeypatch):
    """The first H200 call ended with 157 s of its deadline unused while later sections stopped
    at their caps: a section's unused seconds now extend the next one's cap."""
    from harness.bench import proof

    def bench(records, section, dry_run, timeout, env=None):
        if section == "ceiling":
            return 0, 0.1  # done at once, 8 s of its cap unused
        return proof.run_group([sys.executable, "-c", "import time; time.sleep(60)"], timeout)

    monkeypatch.setattr(proof, "bench_section", bench)
    monkeypatch.setattr(proof, "DRY_SLACK", 1.0)
    monkeypatch.setattr(proof, "BUDGET", {"ceiling": (8.0, 1.0), "transformer": (2.0, 1.0), "decode": (30.0, 1.0)})
    outcomes = proof.run(tmp_path / "r", 600.0, [], 60.0, dry_run=True, say=lambda _line: None)
    assert outcomes[1].status.startswith("stopped at its cap") and 7.0 < outcomes[1].seconds < 20.0
