"""Where the harness keeps its caches (the plugin listing, plugin authors' own caches):
``HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/harness``, else ``~/.cache/harness``."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE_DIR = "HARNESS_CACHE_DIR"


def cache_dir() -> Path:
    """The folder for the harness's caches (not created here)."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness"
