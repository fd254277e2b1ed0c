"""The benchmark scripts under benchmarks/ drive the harness's internals (the worker loop, the
stores); a change there must not leave them broken until the next time someone measures
(study_scale.py was: `run_worker` had changed its signature). Each runs here at its smallest
size, for real, and must write its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_study_scale_runs_at_its_smallest_size(tmp_path):
    out = tmp_path / "scale.md"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "study_scale.py"), "--backend", "sqlite",
                           "--sizes", "30", "--workers", "1", "--out", str(out), "--label", "test"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    assert "### sqlite, 1 workers" in table
    row = next(line for line in table.splitlines() if line.startswith("| 30 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and float(cells[7]) > 0 and float(cells[8]) > 0  # wall, status, report


def test_scaling_coverage_runs_at_its_smallest_size(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling_coverage.py"), "--reps", "1",
                           "--boot", "20", "--seeds", "2", "--noise", "0.01"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| 2 | 0.01 |" in done.stdout


def test_uncounted_flops_runs_at_its_smallest_size(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "uncounted_flops.py"), "--d-model", "16",
                           "--layers", "1", "--lengths", "16"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| attention (multi_head) |" in done.stdout and "| mamba |" in done.stdout


def test_rung_fidelity_runs_at_its_smallest_size(tmp_path):
    """Two learning rates, one seed, rungs at 10 and 20 steps of the quickstart's exported rope
    config: the per-rung table and the rank-correlation table are printed."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", HARNESS_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rung_fidelity.py"),
                           str(ROOT / "benchmarks" / "studies" / "quickstart" / "configs" / "rope.yaml"),
                           "--lrs", "1e-3", "1e-2", "--seeds", "1", "--rungs", "10", "20"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "| lr | step 10 | step 20 |" in out and "| 1.00e-02 | " in out
    assert "| rung | Spearman rho" in out and "| 20 | " in out


@pytest.mark.slow
def test_checkpoint_cpu_runs_at_its_quick_size(tmp_path):
    out = tmp_path / "checkpoint.md"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "checkpoint_cpu.py"), "--quick",
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "transformer" in line]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[2]) >= 2 and float(cells[3]) > 0 and float(cells[4]) > 0  # checkpoints, MB, s


@pytest.mark.slow
def test_batch_memory_runs_at_its_smallest_size(tmp_path):
    out = tmp_path / "batch.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "batch_memory.py"), "--quick", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HARNESS_HOME=str(tmp_path / "home")))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    assert "| transformer | 1 | 8 |" in table and "| mamba | on |" in table


@pytest.mark.slow
def test_compile_cpu_runs_at_its_smallest_size(tmp_path):
    out = tmp_path / "compile.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_cpu.py"), "--quick", "--backend",
                           "aot_eager", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HARNESS_HOME=str(tmp_path / "home")))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    assert "| attention | multi_head | 0 | 1 | 0 | 0 | yes |" in table and "| models | gru |" in table


def test_mup_transfer_runs_at_its_smallest_size(tmp_path):
    """Two widths, a bracketed lr grid and both parametrizations for the Transformer; the record
    has the summary and the tuned-at-the-base table, and a second call reuses the raw runs."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    args = [sys.executable, str(ROOT / "benchmarks" / "mup_transfer.py"), "--models", "transformer",
            "--widths", "16", "32", "--steps", "3", "--warmup", "1", "--batch", "2", "--val", "2",
            "--start", "-6", "-5", "--log2-lr", "-7", "-4", "--raw", str(tmp_path / "raw.jsonl"),
            "--output", str(tmp_path / "record.md")]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = (tmp_path / "record.md").read_text()
    assert "| transformer | standard | 16: " in record and "| transformer | mup | 16: " in record
    assert "| transformer | mup, same lr |" in record
    runs = (tmp_path / "raw.jsonl").read_text().splitlines()
    again = subprocess.run(args[:-2] + ["--report-only"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and " lr=2^" not in again.stdout  # nothing trained again
    assert (tmp_path / "raw.jsonl").read_text().splitlines() == runs
