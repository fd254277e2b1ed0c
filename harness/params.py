"""Typed hyper-parameters with search ranges.

A component declares its hyper-parameters once, as a dataclass whose searchable fields are
annotated with a range::

    @dataclass
    class Config:
        window: Annotated[int, IntRange(8, 256, log=True)] = 64
        dropout: Annotated[float, FloatRange(0.0, 0.3)] = 0.0
        gate: Annotated[str, Choice(("none", "sigmoid"))] = "none"
        eps: float = 1e-6          # no range: fixed unless a config sets it

Ranges are search spaces, not hard limits: a config may fix a value outside them. Hard
limits are bounds from ``annotated_types`` (``Ge``, ``Gt``, ``Le``, ``Lt``, ``Interval``),
checked on every config before anything is built::

        layers: Annotated[int, Ge(1), IntRange(1, 8)] = 2

Every parameter is validated the same way: floats must be finite, booleans are not numbers,
and a value outside its bounds names the field. Constraints between fields belong in
``__post_init__`` (raise ``ValueError`` with a helpful message).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import annotated_types

from harness.errors import (
    ConfigError,
    PluginError,
    pydantic_problem,
    short_list,
    short_repr,
    shorten,
)


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    log: bool = False
    step: int = 1

    def contains(self, value: Any) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high

    def suggest(self, trial: Any, name: str) -> int:
        return int(trial.suggest_int(name, self.low, self.high, log=self.log, step=self.step))

    def describe(self) -> str:
        return f"int [{self.low}, {self.high}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    log: bool = False

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and self.low <= value <= self.high

    def suggest(self, trial: Any, name: str) -> float:
        return float(trial.suggest_float(name, self.low, self.high, log=self.log))

    def describe(self) -> str:
        return f"float [{self.low:g}, {self.high:g}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class Choice:
    options: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))

    def contains(self, value: Any) -> bool:
        return value in self.options

    def suggest(self, trial: Any, name: str) -> Any:
        return trial.suggest_categorical(name, list(self.options))

    def describe(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)


Range = IntRange | FloatRange | Choice


@dataclass
class NoParams:
    """The config of a component without hyper-parameters."""


@dataclass(frozen=True)
class Param:
    """One declared hyper-parameter: its name, type, default, (optional) search range and
    bounds (hard limits, ``annotated_types`` constraints)."""

    name: str
    type: Any
    default: Any
    range: Range | None
    doc: str = ""
    bounds: tuple[Any, ...] = ()

    @property
    def numeric(self) -> bool:
        """Whether the parameter is a number (int or float, possibly optional)."""
        return _number_type(self.type) is not None

    def describe_bounds(self) -> str:
        return ", ".join(_describe_bound(b) for b in self.bounds)


def _number_type(tp: Any) -> type | None:
    """int or float for a numeric type (``int | None`` counts as int); None otherwise."""
    if tp is bool:
        return None
    if tp in (int, float):
        return typing.cast(type, tp)
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None  # tuple[int, ...] is not a number
    for arg in typing.get_args(tp):
        if arg in (int, float):
            return typing.cast(type, arg)
    return None


def _describe_bound(b: Any) -> str:
    for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if getattr(b, attr, None) is not None:
            return f"{op} {getattr(b, attr)}"
    return type(b).__name__


def _bounds(meta: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for m in meta:
        if isinstance(m, annotated_types.Interval):
            out += [b for b in (annotated_types.Gt(m.gt) if m.gt is not None else None,
                                annotated_types.Ge(m.ge) if m.ge is not None else None,
                                annotated_types.Lt(m.lt) if m.lt is not None else None,
                                annotated_types.Le(m.le) if m.le is not None else None) if b]
        elif isinstance(m, annotated_types.BaseMetadata):
            out.append(m)
    return tuple(out)


def declared_params(config: type) -> list[Param]:
    """The hyper-parameters a config dataclass declares, in field order."""
    if not dataclasses.is_dataclass(config):
        raise PluginError(f"{config!r} is not a dataclass; declare hyper-parameters as one.")
    hints = typing.get_type_hints(config, include_extras=True)
    params = []
    for field in dataclasses.fields(config):
        hint = hints[field.name]
        rng = None
        base = hint
        bounds: tuple[Any, ...] = ()
        if typing.get_origin(hint) is typing.Annotated:
            base, *meta = typing.get_args(hint)
            rng = next((m for m in meta if isinstance(m, (IntRange, FloatRange, Choice))), None)
            bounds = _bounds(meta)
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            raise PluginError(
                f"{config.__name__}.{field.name} has no default; every hyper-parameter needs one."
            )
        doc = field.metadata.get("doc", "") if field.metadata else ""
        params.append(Param(field.name, base, default, rng, doc, bounds))
    return params


def search_space(config: type) -> dict[str, Range]:
    """The searchable hyper-parameters of a config: name -> range."""
    return {p.name: p.range for p in declared_params(config) if p.range is not None}


#: Config classes whose defaults passed :func:`check_defaults` in this process (a class is
#: not changed once defined; a plugin file edited and loaded again is a new class).
_CHECKED: weakref.WeakSet[type] = weakref.WeakSet()


def check_defaults(config: type, owner: str) -> None:
    """Raise :class:`PluginError` if a default lies outside its own search range (each class
    checked once a process: the bounds' validators are slow to build, and a study worker
    loads the registry for every trial)."""
    if config in _CHECKED:
        return
    _check_defaults(config, owner)
    _CHECKED.add(config)


def _check_defaults(config: type, owner: str) -> None:
    for p in declared_params(config):
        if p.range is not None and not p.range.contains(p.default):
            raise PluginError(
                f"{owner}: the default of '{p.name}' ({p.default!r}) lies outside its search "
                f"range ({p.range.describe()}). Fix the default or the range in the plugin."
            )
    params = declared_params(config)
    try:
        resolve(config, {p.name: p.default for p in params}, "defaults")
    except ConfigError as exc:
        raise PluginError(f"{owner}: a default breaks its own bounds: {exc}") from None
    from pydantic import TypeAdapter, ValidationError

    for p in params:  # every value a study may sample must lie within the bounds
        if p.range is None or not p.bounds:
            continue
        annotated: Any = typing.Annotated[(p.type, *p.bounds)]  # type: ignore[valid-type]
        check: Any = TypeAdapter(annotated)
        ends = list(p.range.options) if isinstance(p.range, Choice) else [p.range.low, p.range.high]
        for value in ends:
            try:
                check.validate_python(value)
            except ValidationError:
                raise PluginError(f"{owner}: the search range of '{p.name}' ({p.range.describe()}) "
                                  f"includes {value!r}, outside its bounds ({p.describe_bounds()}). "
                                  f"Fix the range or the bounds in the plugin.") from None
    try:
        config()
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{owner}: the default config is invalid: {exc}") from exc


#: The largest magnitude of a number whose parameter declares no upper bound (``Le``/``Lt``):
#: a size, count or scale beyond it is a typo (``1e30``) that would hang or overflow the run,
#: never a setting. A parameter that needs more declares its own bound.
MAX_INT = 2**31 - 1
MAX_FLOAT = 1e12


def _beyond_any_size(p: Param, value: Any) -> str | None:
    """Why ``value`` of an unbounded-above numeric parameter is refused; None if it is not."""
    kind = _number_type(p.type)
    if kind is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if any(getattr(b, "le", None) is not None or getattr(b, "lt", None) is not None for b in p.bounds):
        return None
    limit = MAX_INT if kind is int else MAX_FLOAT
    if abs(value) <= limit:
        return None
    shown = f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"
    return (f"{short_repr(value, 40)} is beyond any sensible value of this parameter (at most "
            f"{shown} in magnitude; it declares no upper bound of its own): a size like this "
            f"cannot be built or trained")


def enumerated(p: Param) -> bool:
    """Whether a parameter's :class:`Choice` lists every value it can take: a choice of
    strings or booleans names the branches the code has (``norm: pre | post``), so a value
    outside it is an error, not a setting the code silently treats as one of them. A choice
    of numbers is a search space like a range (a config may fix any number in the bounds)."""
    return isinstance(p.range, Choice) and not p.numeric


def _not_a_choice(p: Param, value: Any) -> str | None:
    if not enumerated(p) or p.range is None or p.range.contains(value):
        return None
    import difflib

    assert isinstance(p.range, Choice)
    close = difflib.get_close_matches(str(value), [str(o) for o in p.range.options], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{short_repr(value)} is not {p.range.describe()}{hint}"


def value_problem(p: Param, value: Any) -> str | None:
    """Why a single value cannot be meant for ``p`` beyond its type and bounds (a size beyond
    any meaning, a string outside its declared choices); None if it can. Used for configs
    (:func:`resolve`) and for the values a study may sample."""
    return _beyond_any_size(p, value) or _not_a_choice(p, value)


def resolve(config: type, values: Mapping[str, Any] | None, where: str) -> Any:
    """Build a config instance from user values, with errors that name the field.

    ``where`` is the dotted path of the params block in the user's config (for example
    ``model.attention.params``); errors read ``model.attention.params.dropout: ...``.
    """
    from pydantic import ValidationError

    values = dict(values or {})
    declared = {p.name: p for p in declared_params(config)}
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise unknown_params_error(unknown, list(declared), where)
    for name, value in values.items():
        if isinstance(value, bool) and declared[name].numeric:
            raise ConfigError(f"{where}.{name}: expects a number, not a boolean (got {value}).")
        why = value_problem(declared[name], value)
        if why:
            raise ConfigError(f"{where}.{name}: {why}.")
    try:
        return _validator(config).validate_python(values)
    except ValidationError as exc:
        raise ConfigError(pydantic_problem(exc.errors()[0], where) + ".") from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise ConfigError(f"{where}: {shorten(str(exc), 300)}") from None


@functools.cache
def _validator(config: type) -> Any:
    """A pydantic validator of a config dataclass that also refuses inf and NaN."""
    from pydantic import ConfigDict, TypeAdapter

    own = dict(getattr(config, "__pydantic_config__", None) or {})
    config.__pydantic_config__ = ConfigDict(**{**own, "allow_inf_nan": False})  # type: ignore[attr-defined]
    return TypeAdapter(config)


def unknown_params_error(unknown: list[str], known: list[str], where: str) -> ConfigError:
    """The error for parameters a config does not declare, each with its closest known name."""
    import difflib

    hints = []
    for key in unknown[:5]:  # the rest are counted, not listed
        close = difflib.get_close_matches(key, known, n=1)
        hints.append(f"'{shorten(str(key))}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    more = f" and {len(unknown) - 5:,} more" if len(unknown) > 5 else ""
    return ConfigError(
        f"{where}: unknown parameter {', '.join(hints)}{more}. "
        f"Known parameters: {short_list(known, 40) or 'none'}."
    )


def to_dict(instance: Any) -> dict[str, Any]:
    """A config instance as plain data (tuples as lists), as YAML and JSON write it: what a
    run records can be read back by any safe loader and run again."""
    if dataclasses.is_dataclass(instance) and not isinstance(instance, type):
        return dict(_plain(dataclasses.asdict(instance)))
    return {}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def suggest(
    trial: Any,
    config: type,
    prefix: str,
    fixed: Mapping[str, Any] | None = None,
    ranges: Mapping[str, Range] | None = None,
) -> dict[str, Any]:
    """Sample a config's searchable fields from an Optuna trial.

    Parameter names are prefixed (``attention.dropout``) so two components never collide in
    one study. ``fixed`` values are used as given; ``ranges`` replace declared ranges.
    """
    fixed = dict(fixed or {})
    space = {**search_space(config), **dict(ranges or {})}
    values = dict(fixed)
    for name, rng in space.items():
        if name not in fixed:
            values[name] = rng.suggest(trial, f"{prefix}.{name}")
    return values
