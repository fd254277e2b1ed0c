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
