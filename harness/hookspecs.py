"""The plugin contract: one registration hook per kind of component.

A plugin is a module (found through the ``harness`` entry-point group, or a local file
given with ``--plugin`` / ``plugins:``) that implements any of these hooks with the
:data:`harness.hookimpl` marker. Each hook receives a ``register`` callback; the plugin
calls it once per component it provides, passing a spec object. The host stamps every spec
with the plugin's name, distribution and version, so listings and MLflow runs can say
where each component came from.

Hooks are called once, when a plugin manager is built (``harness.loader.load``). They must
be cheap: import torch and other heavy libraries inside the ``build`` functions of your
specs, never at module level, so ``harness list`` and ``harness --help`` stay fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from harness.registry import AttentionSpec, ModelSpec, PositionSpec, TaskSpec

hookspec = pluggy.HookspecMarker("harness")
#: The marker of hook implementations (``@hookimpl def harness_register_attention(register)``).
hookimpl = pluggy.HookimplMarker("harness")


@hookspec
def harness_register_attention(register: Callable[[AttentionSpec], None]) -> None:
    """Register attention variants.

    Called once while plugins load. Call ``register(AttentionSpec(...))`` once per variant.
    The spec's ``build(config, *, d_model, num_heads)`` must return a
    :class:`harness.nn.Attention` subclass instance; ``position_hooks`` declares which
    position hook points (``embedding``, ``qk``, ``bias``) the variant can apply.
    Return nothing.
    """


@hookspec
def harness_register_position(register: Callable[[PositionSpec], None]) -> None:
    """Register position schemes.

    Called once while plugins load. Call ``register(PositionSpec(...))`` once per scheme.
    The spec's ``build(config, *, d_model, num_heads, head_dim, max_length, causal)`` must
    return a :class:`harness.nn.PositionScheme`; ``hooks`` declares the points it acts at.
    Return nothing.
    """


@hookspec
def harness_register_model(register: Callable[[ModelSpec], None]) -> None:
    """Register models.

    Called once while plugins load. Call ``register(ModelSpec(...))`` once per model.
    The spec's ``build(config, *, task, attention, position)`` must return a plain
    ``torch.nn.Module`` whose ``forward`` follows the batch format of the task kinds listed
    in ``task_kinds`` (see :mod:`harness.data`). ``attention`` and ``position`` are
    factories (``None`` when the model does not use them). Return nothing.
    """


@hookspec
def harness_register_task(register: Callable[[TaskSpec], None]) -> None:
    """Register tasks.

    Called once while plugins load. Call ``register(TaskSpec(...))`` once per task. The
    spec's ``build(config, *, seed)`` must return a :class:`harness.data.Task`.
    Return nothing.
    """
