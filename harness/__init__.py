"""attention-harness: compare attention variants, position schemes and baselines fairly.

Public API (cheap to import; torch, lightning and mlflow load only when used)::

    import harness
    harness.list_plugins("attention")
    model = harness.create_model("transformer", attention="multi_head", position="rope",
                                 vocab_size=32, max_length=128, d_model=64)
    task = harness.create_task("copy", length=16)
    result = harness.train("run.yaml")      # or a dict / harness.config.RunConfig

Plugin authors import :data:`hookimpl` and the spec classes from here.
"""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("harness")

from harness.api import create_model, create_task, list_plugins, load_plugins, train  # noqa: E402
from harness.registry import AttentionSpec, ModelSpec, PositionSpec, TaskSpec  # noqa: E402

__all__ = [
    "AttentionSpec",
    "ModelSpec",
    "PositionSpec",
    "TaskSpec",
    "create_model",
    "create_task",
    "hookimpl",
    "list_plugins",
    "load_plugins",
    "train",
]
