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
constraints belong in ``__post_init__`` (raise ``ValueError`` with a helpful message).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError, PluginError


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
    """One declared hyper-parameter: its name, type, default and (optional) search range."""

    name: str
    type: Any
    default: Any
    range: Range | None
    doc: str = ""


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
        if typing.get_origin(hint) is typing.Annotated:
            base, *meta = typing.get_args(hint)
            rng = next((m for m in meta if isinstance(m, (IntRange, FloatRange, Choice))), None)
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            raise PluginError(
                f"{config.__name__}.{field.name} has no default; every hyper-parameter needs one."
            )
        doc = field.metadata.get("doc", "") if field.metadata else ""
        params.append(Param(field.name, base, default, rng, doc))
    return params


def search_space(config: type) -> dict[str, Range]:
    """The searchable hyper-parameters of a config: name -> range."""
    return {p.name: p.range for p in declared_params(config) if p.range is not None}


def check_defaults(config: type, owner: str) -> None:
    """Raise :class:`PluginError` if a default lies outside its own search range."""
    for p in declared_params(config):
        if p.range is not None and not p.range.contains(p.default):
            raise PluginError(
                f"{owner}: the default of '{p.name}' ({p.default!r}) lies outside its search "
                f"range ({p.range.describe()}). Fix the default or the range in the plugin."
            )
    try:
        config()
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{owner}: the default config is invalid: {exc}") from exc


def resolve(config: type, values: Mapping[str, Any] | None, where: str) -> Any:
    """Build a config instance from user values, with errors that name the field.

    ``where`` is the dotted path of the params block in the user's config (for example
    ``model.attention.params``); errors read ``model.attention.params.dropout: ...``.
    """
    from pydantic import TypeAdapter, ValidationError

    values = dict(values or {})
    names = [p.name for p in declared_params(config)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise unknown_params_error(unknown, names, where)
    try:
        return TypeAdapter(config).validate_python(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{where}.{loc}: {err['msg']} (got {err.get('input')!r}).") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def unknown_params_error(unknown: list[str], known: list[str], where: str) -> ConfigError:
    """The error for parameters a config does not declare, each with its closest known name."""
    import difflib

    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return ConfigError(
        f"{where}: unknown parameter {', '.join(hints)}. "
        f"Known parameters: {', '.join(known) or 'none'}."
    )


def to_dict(instance: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(instance) and not isinstance(instance, type):
        return dataclasses.asdict(instance)
    return {}


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
