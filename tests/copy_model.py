"""A model trained to 100% on copy in about 6 s: what the generation and lm-eval tests read
their known answers from (tests/test_generate.py, tests/test_evaluation.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run.pipeline import train

COPY = {"task": {"name": "copy", "params": {"length": 4, "vocab": 5, "num_train": 400, "num_val": 32}},
        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}},
        "train": {"max_steps": 160, "batch_size": 32, "val_every": 160, "progress": False,
                  "num_threads": 1, "lr": 1e-2, "warmup_steps": 20, "log_attention": False}}


def train_copy(root: Path) -> tuple[str, str]:
    """(run id, tracking URI) of the copy model trained under ``root`` (its store and home)."""
    uri = f"sqlite:///{root / 'm.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(root / "home"))
        result = train({**COPY, "tracking": {"uri": uri}})
    assert result.metrics["val/exact"] == 1.0
    return result.run_id, uri
