"""The data benchmarks (benchmarks/data_prepare.py, data_loader.py) run at their smallest
size and write their tables, so they never rot between measurements."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, cwd: Path) -> str:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_prepare_benchmark_runs_at_its_smallest_size(tmp_path):
    out = tmp_path / "data.md"
    run("data_prepare.py", "--sizes", "1", "--tokenizers", "bytes", "--workers", "1", "--out", str(out), cwd=tmp_path)
    row = next(line for line in out.read_text().splitlines() if line.startswith("| 1 | bytes |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # wall (one decimal: 1 MB of bytes can take under 0.05 s on an idle machine), MB/s, RSS
    assert float(cells[3]) >= 0 and float(cells[4]) > 0 and float(cells[6]) > 0


@pytest.mark.slow
def test_loader_benchmark_runs_at_its_smallest_size(tmp_path):
    out = tmp_path / "data.md"
    run("data_loader.py", "--mb", "1", "--steps", "12", "--length", "32", "--batch", "4", "--out", str(out), cwd=tmp_path)
    text = out.read_text()
    assert "| loader / model |" in text and "`cost/data_wait_share`" in text
