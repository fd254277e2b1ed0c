"""The plugin contract: one registration hook per kind of component.

A plugin is a module (found through the ``harness`` entry-point group, or a local file
given with ``--plugin`` / ``plugins:``) that implements any of these hooks with the
:data:`harness.hookimpl` marker. Each hook receives a ``register`` callback; the plugin
calls it once per component it provides, passing a spec object. The host stamps every spec
with the plugin's name, distribution and version, so listings and MLflow runs can say
where each component came from.

Hooks are called once per plugin, through pluggy (so ``HARNESS_TRACE_PLUGINS=1`` shows each
call), when plugins are loaded (:func:`harness.registry.loader.load`). A plugin module is plain
Python: its config dataclasses, its top-level module classes and the registration. The host
keeps ``harness --help`` free of plugin imports and caches ``harness list``; a plugin that
imports a heavy library of its own at module level is named in ``harness list``'s warnings
with the time it adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from harness.registry.specs import AttentionSpec, MixerSpec, ModelSpec, PositionSpec, TaskSpec

hookspec = pluggy.HookspecMarker("harness")
#: The marker of hook implementations (``@hookimpl def harness_register_attention(register)``).
hookimpl = pluggy.HookimplMarker("harness")


@hookspec
def harness_register_attention(register: Callable[[AttentionSpec], None]) -> None:
    """Register attention variants.

    Called once while plugins load. Call ``register(AttentionSpec(...))`` once per variant.
    The spec's ``build(config, *, d_model, num_heads)`` (usually the variant's class) must
    return a :class:`harness.nn.Attention`; the position hook points it applies
    (``embedding``, ``qk``, ``bias``), its directions and complexity are read from the class.
    Return nothing.
    """


@hookspec
def harness_register_mixer(register: Callable[[MixerSpec], None]) -> None:
    """Register sequence mixers that are not softmax attention (state-space models, linear
    RNNs, long convolutions).

    Called once while plugins load. Call ``register(MixerSpec(...))`` once per mixer. The
    spec's ``build(config, *, d_model, num_heads)`` (usually the mixer's class) must return a
    :class:`harness.nn.Mixer`; its directions, complexity and position hooks are read from
    the class. Return nothing.
    """


@hookspec
def harness_register_position(register: Callable[[PositionSpec], None]) -> None:
    """Register position schemes.

    Called once while plugins load. Call ``register(PositionSpec(...))`` once per scheme.
    The spec's ``build(config, *, d_model, num_heads, head_dim, max_length, causal)``
    (usually the scheme's class) must return a :class:`harness.nn.PositionScheme`; the points
    it acts at are derived from the hook methods it overrides. Return nothing.
    """


@hookspec
def harness_register_model(register: Callable[[ModelSpec], None]) -> None:
    """Register models.

    Called once while plugins load. Call ``register(ModelSpec(...))`` once per model.
    The spec's ``build(config, *, task, attention, position)`` must return a plain
    ``torch.nn.Module`` whose ``forward`` follows the batch format of the task kinds listed
    in ``task_kinds`` (see :mod:`harness.data.formats`). ``attention``, ``position`` (and ``mixer``,
    passed only to a model that declares ``uses_mixer``) are factories (``None`` when the
    config gives none). Return nothing.
    """


@hookspec
def harness_register_task(register: Callable[[TaskSpec], None]) -> None:
    """Register tasks.

    Called once while plugins load. Call ``register(TaskSpec(...))`` once per task. The
    spec's ``build(config, *, seed)`` (usually the task's class) must return a
    :class:`harness.data.tasks.Task`; its kind is read from the class. Return nothing.
    """
