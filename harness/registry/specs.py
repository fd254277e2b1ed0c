"""Specs by kind, with unknown-name and duplicate-name errors.

A spec is the data a plugin registers for one component: its name, how to build it (its
module class, or a function), its config dataclass (hyper-parameters with search ranges)
and what it declares about itself (which position hooks an attention variant applies, which
task kinds a model supports, ...). What the class already says is derived from it, never
declared twice: the config from the constructor's annotation, the description from the
docstring, a position scheme's hook points from the methods it overrides, a task's kind
from its class, a mixer's directions, complexity and position hooks from its class
attributes. Building a spec never imports torch; deriving reads only class attributes.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from harness.data.formats import FORMATS
from harness.errors import PluginError, UnknownNameError
from harness.params import NoParams, check_defaults


class PluginKind(StrEnum):
    """The kinds of component a plugin can register (one hook each)."""

    ATTENTION = "attention"
    MIXER = "mixer"
    POSITION = "position"
    MODEL = "model"
    TASK = "task"


#: The three points at which a position scheme can act.
POSITION_HOOKS = frozenset({"embedding", "qk", "bias"})
#: The position-scheme methods behind each hook point.
HOOK_METHODS = {"embed": "embedding", "rotate": "qk", "score_bias": "bias"}
#: Task kinds; each is the name of a batch format (see harness.data.formats).
TASK_KINDS = frozenset(FORMATS)
#: Directions a sequence mixer can run in.
DIRECTIONS = frozenset({"causal", "bidirectional"})


def _first_line(doc: str | None) -> str:
    """The first sentence of a docstring, for a spec's description."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    return text.split(". ")[0].rstrip(".") + "." if text else ""


def _config_of(build: Any) -> type | None:
    """The annotation of a class constructor's first argument (its config dataclass)."""
    if not inspect.isclass(build):
        return None
    try:
        hints = typing.get_type_hints(build.__init__)
    except Exception:  # unresolvable annotations: the spec must name its config
        return None
    params = [p for p in inspect.signature(build.__init__).parameters.values() if p.name != "self"]
    if not params:
        return None
    hint = hints.get(params[0].name)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


@dataclass(frozen=True)
class Spec:
    """Common fields of every spec. ``plugin``, ``distribution`` and ``version`` are
    stamped by the host when the plugin registers the spec.

    ``build``: the component's module class (or any callable) that the host calls as
    ``build(config, **context)``; the context of each kind is in its spec's docstring.
    ``config`` defaults to the annotation of the class constructor's first argument, and
    ``description`` to the first sentence of the class docstring.
    ``exempt``: conformance checks (:mod:`harness.testing`) that do not apply to this
    component, each with the reason (``{"row_stochastic": "weights are kernel features"}``);
    shown by ``harness list -v`` and ``harness check``, never skipped silently.
    ``reference``: an independent float64 implementation that the conformance kit compares
    the component with on random inputs (its signature per kind: :mod:`harness.testing`).
    ``check_params``: hyper-parameters the conformance kit uses under the ones its caller
    gives, for a component whose defaults cannot be built on their own (a task that reads
    the user's files names a small sample shipped with it).
    """

    kind: ClassVar[str] = ""
    name: str
    build: Callable[..., Any]
    config: type = NoParams
    description: str = ""
    exempt: dict[str, str] = field(default_factory=dict)
    reference: Callable[..., Any] | None = None
    check_params: dict[str, Any] = field(default_factory=dict)
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        if self.config is NoParams:
            derived = _config_of(self.build)
            if derived is not None:
                object.__setattr__(self, "config", derived)
        if not self.description and inspect.isclass(self.build):
            object.__setattr__(self, "description", _first_line(self.build.__doc__))

    def provenance(self) -> str:
        dist = f"{self.distribution} {self.version}".strip()
        return f"{self.plugin} ({dist})" if dist else self.plugin

    def declarations(self) -> list[str]:
        """What the spec declares about itself, as lines for listings."""
        return []

    def notes(self) -> list[str]:
        """Declarations every kind shares: exemptions with their reasons, a reference."""
        lines = [f"exempt from {check}: {why}" for check, why in sorted(self.exempt.items())]
        return lines + (["float64 reference: declared"] if self.reference is not None else [])


def _class_attr(build: Any, name: str, default: Any) -> Any:
    return getattr(build, name, default) if inspect.isclass(build) else default


@dataclass(frozen=True)
class SequenceMixerSpec(Spec):
    """What attention variants and mixers both declare (derived from the module class's
    attributes when ``build`` is one; see :mod:`harness.nn.mixer`).

    ``position_hooks``: the position hook points the layer applies; a variant that never
    forms the score matrix (linear attention) cannot apply an additive score ``bias``.
    ``why_not``: for each hook it cannot apply, the reason, shown when a pairing is rejected.
    ``directions``: ``causal`` and/or ``bidirectional``. ``complexity``: time and memory of
    the parallel form, time per decoded token and decoding-state size, in the length L.
    """

    position_hooks: frozenset[str] | None = None
    why_not: dict[str, str] | None = None
    directions: frozenset[str] | None = None
    complexity: Any = None  # harness.nn.mixer.Complexity

    _defaults: ClassVar[dict[str, Any]] = {}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, default in self._defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, _class_attr(self.build, name, default))

    def declarations(self) -> list[str]:
        c = self.complexity
        cost = f"; time {c.time}, memory {c.memory}, decode {c.decode}/token, state {c.state}" if c else ""
        return [f"position hooks: {', '.join(sorted(self.position_hooks or ())) or 'none'}; "
                f"directions: {', '.join(sorted(self.directions or ()))}{cost}"]


@dataclass(frozen=True)
class AttentionSpec(SequenceMixerSpec):
    """An attention variant: ``build(config, *, d_model, num_heads)`` returns a
    :class:`harness.nn.Attention` (``build=`` the variant's class)."""

    kind: ClassVar[str] = PluginKind.ATTENTION
    _defaults: ClassVar[dict[str, Any]] = {
        "position_hooks": POSITION_HOOKS, "why_not": {}, "directions": DIRECTIONS, "complexity": None,
    }


@dataclass(frozen=True)
class MixerSpec(SequenceMixerSpec):
    """A sequence mixer that is not softmax attention (a state-space model, a linear RNN, a
    long convolution): ``build(config, *, d_model, num_heads)`` returns a
    :class:`harness.nn.Mixer`; models take it where they take attention
    (``model.mixer: {name: mamba}``)."""

    kind: ClassVar[str] = PluginKind.MIXER
    _defaults: ClassVar[dict[str, Any]] = {
        "position_hooks": frozenset({"embedding"}), "why_not": {}, "directions": frozenset({"causal"}),
        "complexity": None,
    }


@dataclass(frozen=True)
class PositionSpec(Spec):
    """A position scheme: ``build(config, *, d_model, num_heads, head_dim, max_length,
    causal)`` returns a :class:`harness.nn.PositionScheme`.

    ``hooks``: the points the scheme acts at (``embedding``, ``qk``, ``bias``); derived from
    the methods a scheme class overrides (``embed``, ``rotate``, ``score_bias``).
    ``extrapolates``: False if the scheme cannot run past the length it was built for.
    """

    kind: ClassVar[str] = PluginKind.POSITION
    hooks: frozenset[str] | None = None
    extrapolates: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hooks is None:
            object.__setattr__(self, "hooks", frozenset(_overridden_hooks(self.build)))

    def declarations(self) -> list[str]:
        return [f"acts at: {', '.join(sorted(self.hooks or ())) or 'nothing'}"
                + ("" if self.extrapolates else "; fixed length")]


def _overridden_hooks(build: Any) -> set[str]:
    """The hook points a position-scheme class implements (its methods that differ from the
    base class's identity hooks); empty for a build function."""
    if not inspect.isclass(build):
        return set()
    hooks = set()
    for method, hook in HOOK_METHODS.items():
        owner = next((c for c in build.__mro__ if method in vars(c)), None)
        if owner is not None and owner.__name__ != "PositionScheme":
            hooks.add(hook)
    return hooks


@dataclass(frozen=True)
class ModelSpec(Spec):
    """A model: ``build(config, *, task, attention, position)`` (and ``mixer=`` when
    ``uses_mixer``) returns a plain ``torch.nn.Module``.

    ``task_kinds``: the batch formats the model's ``forward`` accepts. A model that accepts
    ``lm`` also serves ``seq2seq`` tasks (source and target are concatenated, only the target
    is scored). ``uses_attention`` / ``uses_position``: whether the model takes an attention
    variant / position scheme (``attention_required=False``: the model also runs without
    one); ``attention_roles``: the roles in which the model uses attention (e.g.
    ``encoder``, ``decoder``, ``cross``), each of which a config may give its own variant; ``default_attention`` / ``default_position``: used when the config names none.
    ``extrapolates``: False for fixed-length models. ``width_param``: the integer
    hyper-parameter that sets the model's width (``d_model``, ``hidden``), which studies
    adjust to match candidates by parameter count. ``separates_documents``: the model keeps
    the documents of a window apart when ``TaskInfo.document_token`` is set (a task's
    ``documents: separate``); a model that does not is refused for such a task.
    """

    kind: ClassVar[str] = PluginKind.MODEL
    task_kinds: frozenset[str] = frozenset({"lm"})
    uses_attention: bool = False
    attention_required: bool = True
    attention_roles: tuple[str, ...] = ()
    uses_position: bool = False
    uses_mixer: bool = False
    default_attention: str | None = None
    default_position: str | None = None
    extrapolates: bool = True
    width_param: str | None = None
    separates_documents: bool = False
    #: named presets: ``{"transformer++": {"params": {...}, "position": {"name": "rope"}}}``;
    #: a config's ``preset`` fills these in under the values it sets itself
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def declarations(self) -> list[str]:
        uses = [u for u, flag in (("attention", self.uses_attention), ("mixer", self.uses_mixer),
                                  ("position", self.uses_position)) if flag]
        line = (f"task kinds: {', '.join(sorted(self.task_kinds))}; uses: {', '.join(uses) or 'neither'}"
                + ("" if self.extrapolates else "; fixed length")
                + ("; separates documents" if self.separates_documents else ""))
        return [line] + ([f"presets: {', '.join(self.presets)}"] if self.presets else [])


@dataclass(frozen=True)
class TaskSpec(Spec):
    """A task: ``build(config, *, seed)`` returns a :class:`harness.data.tasks.Task`. ``task_kind``
    (``lm``, ``seq2seq``, ``classification``, ``tagging``; see :mod:`harness.data.formats`) is
    derived from the task class's ``task_kind``; a build function must declare it."""

    kind: ClassVar[str] = PluginKind.TASK
    task_kind: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task_kind is None:
            object.__setattr__(self, "task_kind", _class_attr(self.build, "task_kind", "lm"))

    def declarations(self) -> list[str]:
        return [f"task kind: {self.task_kind}"]


SPEC_TYPES: dict[str, type[Spec]] = {
    cls.kind: cls for cls in (AttentionSpec, MixerSpec, PositionSpec, ModelSpec, TaskSpec)
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
        self.warnings: list[str] = []  # plugins that loaded but slow every start, ...

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
    if isinstance(spec, SequenceMixerSpec):
        if not (spec.position_hooks or frozenset()) <= POSITION_HOOKS:
            raise PluginError(f"plugin {plugin}: unknown position hooks {set(spec.position_hooks or ())}")
        if not spec.directions or not spec.directions <= DIRECTIONS:
            raise PluginError(f"plugin {plugin}: directions must be a non-empty subset of {set(DIRECTIONS)}")
    if isinstance(spec, PositionSpec):
        hooks = spec.hooks or frozenset()
        if not hooks <= POSITION_HOOKS:
            raise PluginError(f"plugin {plugin}: unknown position hooks {set(hooks)}")
        implemented = _overridden_hooks(spec.build)
        if inspect.isclass(spec.build) and hooks != implemented:
            raise PluginError(
                f"plugin {plugin}: position '{spec.name}' declares hooks {sorted(hooks)} but its class "
                f"implements {sorted(implemented)}; leave `hooks` out and it is derived."
            )
    if isinstance(spec, ModelSpec) and not spec.task_kinds <= TASK_KINDS:
        raise PluginError(f"plugin {plugin}: unknown task kinds {set(spec.task_kinds)}")
    if isinstance(spec, TaskSpec) and spec.task_kind not in TASK_KINDS:
        raise PluginError(f"plugin {plugin}: unknown task kind {spec.task_kind!r}")
    return spec


def stamp(spec: Spec, plugin: str, distribution: str, version: str) -> Spec:
    return dataclasses.replace(spec, plugin=plugin, distribution=distribution, version=version)
