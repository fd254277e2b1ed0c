"""Specs by kind, with unknown-name and duplicate-name errors.

A spec is the data a plugin registers for one component: its name, a ``build`` function,
its config dataclass (hyper-parameters with search ranges) and what it declares about
itself (which position hooks an attention variant applies, which task kinds a model
supports, ...). The registry never imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.errors import PluginError, UnknownNameError
from harness.params import NoParams, check_defaults

#: The three points at which a position scheme can act.
POSITION_HOOKS = frozenset({"embedding", "qk", "bias"})
#: Task kinds; each fixes a batch format (see harness.data).
TASK_KINDS = frozenset({"lm", "seq2seq", "classification", "tagging"})


@dataclass(frozen=True)
class Spec:
    """Common fields of every spec. ``plugin``, ``distribution`` and ``version`` are
    stamped by the host when the plugin registers the spec."""

    kind: ClassVar[str] = ""
    name: str
    build: Callable[..., Any]
    config: type = NoParams
    description: str = ""
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    def provenance(self) -> str:
        dist = f"{self.distribution} {self.version}".strip()
        return f"{self.plugin} ({dist})" if dist else self.plugin


@dataclass(frozen=True)
class AttentionSpec(Spec):
    """An attention variant. ``build(config, *, d_model, num_heads) -> harness.nn.Attention``.

    ``position_hooks``: the position hook points this variant applies. A variant that never
    forms the score matrix (linear attention) cannot apply an additive score ``bias``.
    ``why_not``: for each hook it cannot apply, the reason, shown when a pairing is rejected.
    """

    kind: ClassVar[str] = "attention"
    position_hooks: frozenset[str] = POSITION_HOOKS
    why_not: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PositionSpec(Spec):
    """A position scheme. ``build(config, *, d_model, num_heads, head_dim, max_length,
    causal) -> harness.nn.PositionScheme``.

    ``hooks``: the points the scheme acts at (``embedding``, ``qk``, ``bias``).
    ``extrapolates``: False if the scheme cannot run past the length it was built for.
    """

    kind: ClassVar[str] = "position"
    hooks: frozenset[str] = frozenset()
    extrapolates: bool = True


@dataclass(frozen=True)
class ModelSpec(Spec):
    """A model. ``build(config, *, task, attention, position) -> torch.nn.Module``.

    ``task_kinds``: the batch formats the model's ``forward`` accepts. A model that accepts
    ``lm`` also serves ``seq2seq`` tasks (source and target are concatenated, only the target
    is scored). ``uses_attention`` / ``uses_position``: whether the model takes an attention
    variant / position scheme (``attention_required=False``: the model also runs without
    one); ``attention_roles``: the roles in which the model uses attention (e.g.
    ``encoder``, ``decoder``, ``cross``), each of which a config may give its own variant; ``default_attention`` / ``default_position``: used when the config names none.
    ``extrapolates``: False for fixed-length models. ``width_param``: the integer
    hyper-parameter that sets the model's width (``d_model``, ``hidden``), which studies
    adjust to match candidates by parameter count.
    """

    kind: ClassVar[str] = "model"
    task_kinds: frozenset[str] = frozenset({"lm"})
    uses_attention: bool = False
    attention_required: bool = True
    attention_roles: tuple[str, ...] = ()
    uses_position: bool = False
    default_attention: str | None = None
    default_position: str | None = None
    extrapolates: bool = True
    width_param: str | None = None


@dataclass(frozen=True)
class TaskSpec(Spec):
    """A task. ``build(config, *, seed) -> harness.data.Task``. ``task_kind`` is one of
    ``lm``, ``seq2seq``, ``classification``, ``tagging`` (see :mod:`harness.data`)."""

    kind: ClassVar[str] = "task"
    task_kind: str = "lm"


SPEC_TYPES: dict[str, type[Spec]] = {
    cls.kind: cls for cls in (AttentionSpec, PositionSpec, ModelSpec, TaskSpec)
}
KINDS = tuple(SPEC_TYPES)


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose registration was rejected."""

    plugin: str
    distribution: str
    version: str
    error: str

    def describe(self) -> str:
        dist = f"{self.distribution} {self.version}".strip()
        return f"{self.plugin}" + (f" ({dist})" if dist else "") + f": {self.error}"


class Registry:
    """Registered specs by kind and name, plus the plugins that failed to load.

    Two plugins registering the same name is an error naming both: the name becomes
    unusable (``get`` raises) until one plugin is disabled, but listing and every other
    name keep working.
    """

    def __init__(self) -> None:
        self._specs: dict[str, dict[str, Spec]] = {k: {} for k in KINDS}
        self._conflicts: dict[str, dict[str, list[Spec]]] = {k: {} for k in KINDS}
        self.failures: list[PluginFailure] = []

    def add(self, spec: Spec) -> None:
        kind = spec.kind
        if kind not in self._specs:
            raise PluginError(f"unknown component kind {kind!r}")
        if spec.name in self._conflicts[kind]:
            self._conflicts[kind][spec.name].append(spec)
            return
        if spec.name in self._specs[kind]:
            first = self._specs[kind].pop(spec.name)
            self._conflicts[kind][spec.name] = [first, spec]
            return
        self._specs[kind][spec.name] = spec

    def names(self, kind: str) -> list[str]:
        return sorted(self._specs[kind])

    def specs(self, kind: str) -> list[Spec]:
        return [self._specs[kind][n] for n in self.names(kind)]

    def conflicts(self, kind: str) -> dict[str, list[Spec]]:
        return dict(self._conflicts[kind])

    def __iter__(self) -> Iterator[Spec]:
        for kind in KINDS:
            yield from self.specs(kind)

    def get(self, kind: str, name: str) -> Any:
        """The spec of ``kind`` called ``name``, or a :class:`UnknownNameError` /
        :class:`PluginError` that says what to do."""
        if name in self._specs[kind]:
            return self._specs[kind][name]
        if name in self._conflicts[kind]:
            owners = " and ".join(s.provenance() for s in self._conflicts[kind][name])
            raise PluginError(
                f"{kind} '{name}' is registered by more than one plugin: {owners}. "
                f"Disable all but one (HARNESS_DISABLE_PLUGINS=<entry point>, or an allow-list "
                f"in HARNESS_PLUGINS) or ask a plugin author to rename theirs."
            )
        known = self.names(kind)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        msg = f"unknown {kind} '{name}'."
        if close:
            msg += " Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
        msg += f" Registered {kind} names: {', '.join(known) or 'none'}."
        if self.failures:
            msg += " These plugins failed to load and may provide it: " + "; ".join(
                f.describe() for f in self.failures
            )
            msg += "."
        msg += " Run `harness list` to see every plugin."
        raise UnknownNameError(msg)


def validate_spec(spec: Any, kind: str, plugin: str) -> Spec:
    """Check what a plugin passed to ``register``; raise PluginError naming the plugin."""
    expected = SPEC_TYPES[kind]
    if not isinstance(spec, expected):
        raise PluginError(
            f"plugin {plugin} passed {type(spec).__name__} to the {kind} register callback; "
            f"it must pass a harness.{expected.__name__}."
        )
    if not spec.name or not spec.name.replace("_", "").replace("-", "").isalnum():
        raise PluginError(f"plugin {plugin}: invalid {kind} name {spec.name!r}")
    if not callable(spec.build):
        raise PluginError(f"plugin {plugin}: {kind} '{spec.name}' has no callable build")
    check_defaults(spec.config, f"{kind} '{spec.name}' (plugin {plugin})")
    if isinstance(spec, AttentionSpec) and not spec.position_hooks <= POSITION_HOOKS:
        raise PluginError(f"plugin {plugin}: unknown position hooks {set(spec.position_hooks)}")
    if isinstance(spec, PositionSpec) and not spec.hooks <= POSITION_HOOKS:
        raise PluginError(f"plugin {plugin}: unknown position hooks {set(spec.hooks)}")
    if isinstance(spec, ModelSpec) and not spec.task_kinds <= TASK_KINDS:
        raise PluginError(f"plugin {plugin}: unknown task kinds {set(spec.task_kinds)}")
    if isinstance(spec, TaskSpec) and spec.task_kind not in TASK_KINDS:
        raise PluginError(f"plugin {plugin}: unknown task kind {spec.task_kind!r}")
    return spec


def stamp(spec: Spec, plugin: str, distribution: str, version: str) -> Spec:
    return dataclasses.replace(spec, plugin=plugin, distribution=distribution, version=version)
