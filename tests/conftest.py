"""Shared fixtures: every test gets its own project-local store; torch stays polite on 2 cores."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def harness_home(tmp_path, monkeypatch):
    """An empty HARNESS_HOME per test; no inherited tracking URI or plugin filters."""
    home = tmp_path / ".harness"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))  # never the user's cache
    monkeypatch.setenv("HARNESS_WORKERS_DIR", str(tmp_path / "workers"))  # workers of this test only
    # every space of a CLI paragraph a line break (harness.errors.fill): a test asserting a phrase
    # on wrapped text fails every time, not by a path's length (assert on tests/text.py's flat)
    monkeypatch.setenv("HARNESS_WRAP_WIDTH", "1")
    for var in ("MLFLOW_TRACKING_URI", "HARNESS_PLUGINS", "HARNESS_DISABLE_PLUGINS",
                "HARNESS_NO_AUTOLOAD", "HARNESS_TRACE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def registry():
    """All installed plugins, loaded once per session."""
    import harness

    return harness.load_plugins()
