"""A candidate's search space: its components validated against the registry.

Owns turning one YAML candidate into a :class:`CandidateSpace`: each component's plugin
spec, its fixed values and its effective search ranges (a declared range, replaced by the
YAML's ``search`` or switched off by ``search_declared: false``), the parsing of YAML ranges
(a list of options or ``{low, high, log, step}``), and the widths tried when a study
matches parameter counts. Errors name the field (``candidates[2].model.position.search.base``).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from harness.errors import ConfigError, HarnessError, pydantic_message, short_repr
from harness.params import (
    Choice,
    FloatRange,
    IntRange,
    Param,
    Range,
    declared_params,
    suggest,
    unknown_params_error,
    value_problem,
)
from harness.registry.specs import Registry
from harness.study import recall
from harness.study.schema import Candidate, SearchComponent


@dataclass
class ComponentSpace:
    """One component of a candidate: its spec, fixed values and effective search ranges."""

    role: str  # model, attention or position (also the Optuna parameter prefix)
    spec: Any
    fixed: dict[str, Any]
    ranges: dict[str, Range]

    def sample(self, trial: Any | None) -> dict[str, Any]:
        """Sampled values (``trial``) or the fixed values alone (plugin defaults elsewhere)."""
        if trial is None:
            return dict(self.fixed)
        return suggest(trial, self.spec.config, self.role, self.fixed, self.ranges)


@dataclass
class CandidateSpace:
    index: int
    candidate: Candidate
    model: ComponentSpace
    attention: ComponentSpace | None
    position: ComponentSpace | None
    mixer: ComponentSpace | None = None
    width_param: str | None = None  # set when the study matches parameter counts or state sizes
    widths: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.candidate.name

    def components(self) -> list[ComponentSpace]:
        return [c for c in (self.model, self.attention, self.mixer, self.position) if c is not None]

    def label(self) -> str:
        return " · ".join(c.spec.name for c in self.components())


def _numeric(tp: Any) -> type | None:
    """int or float for a parameter's declared type (``int | None`` counts as int)."""
    if tp is bool:
        return None
    if tp in (int, float):
        return typing.cast(type, tp)
    for arg in typing.get_args(tp):
        if arg in (int, float):
            return typing.cast(type, arg)
    return None


def parse_range(raw: Any, kind: type | None, where: str) -> Range:
    """A YAML range: a list of options, or ``{low, high, log, step}`` for numbers."""
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(f"{where}: an empty list of options; give at least one value.")
        return Choice(tuple(raw))
    if isinstance(raw, dict):
        if kind is None:
            raise ConfigError(f"{where}: this parameter is not numeric; give a list of options.")
        unknown = sorted(set(raw) - {"low", "high", "log", "step"})
        if unknown or "low" not in raw or "high" not in raw:
            raise ConfigError(
                f"{where}: a numeric range is {{low: L, high: H}} with optional log: true and "
                f"step (integers); got {short_repr(raw)}."
            )
        low, high, log = raw["low"], raw["high"], bool(raw.get("log", False))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise ConfigError(f"{where}: low and high must be numbers; got {short_repr(low)} and "
                              f"{short_repr(high)}.")
        if low > high or (log and low <= 0):
            raise ConfigError(f"{where}: need low <= high (and low > 0 with log: true); got {short_repr(raw)}.")
        if kind is int:
            step = raw.get("step", 1)
            if not all(isinstance(v, int) for v in (low, high, step)) or step < 1:
                raise ConfigError(f"{where}: an integer parameter needs integer low, high and step.")
            if log and step != 1:
                raise ConfigError(f"{where}: log: true cannot be combined with step.")
            return IntRange(low, high, log=log, step=step)
        if "step" in raw:
            raise ConfigError(f"{where}: step applies to integer parameters only.")
        return FloatRange(float(low), float(high), log=log)
    raise ConfigError(
        f"{where}: {short_repr(raw)} is not a range. Give a list of options or {{low, high}}; to fix a "
        f"value, put it under params instead."
    )


def range_values(rng: Range) -> list[Any]:
    """Values that must each be valid: the options, or the ends of a numeric range."""
    return list(rng.options) if isinstance(rng, Choice) else [rng.low, rng.high]


def component_space(
    registry: Registry, role: str, comp: SearchComponent, where: str, width: str | None = None
) -> ComponentSpace:
    """Validate a candidate's component (names, fixed values, ranges) into a space."""
    kind = "model" if role == "model" else role
    try:
        spec = registry.get(kind, comp.name)
    except HarnessError as exc:
        raise ConfigError(f"{where}.name: {exc}") from None
    params = {p.name: p for p in declared_params(spec.config)}
    for key, values in (("params", comp.params), ("search", comp.search)):
        unknown = sorted(set(values) - set(params))
        if unknown:
            raise unknown_params_error(unknown, list(params), f"{where}.{key}")
    both = sorted(set(comp.params) & set(comp.search))
    if both:
        raise ConfigError(
            f"{where}: {', '.join(both)} is both fixed (params) and searched (search); keep one."
        )
    for name, value in comp.params.items():
        _check_type(params[name], value, f"{where}.params.{name}")
    fixed = dict(comp.params)
    ranges: dict[str, Range] = {}
    for name, raw in comp.search.items():
        rng = parse_range(raw, _numeric(params[name].type), f"{where}.search.{name}")
        for value in range_values(rng):
            _check_type(params[name], value, f"{where}.search.{name}")
        ranges[name] = rng
    if not comp.search_declared:
        fixed.update({p.name: p.default for p in params.values()
                      if p.range is not None and p.name not in ranges and p.name not in fixed})
    if width is not None:  # set per trial by parameter matching; a placeholder until then
        ranges.pop(width, None)
        fixed[width] = params[width].default
    return ComponentSpace(role, spec, fixed, ranges)


def _check_type(param: Param, value: Any, where: str) -> None:
    """One value against its declared type. Constraints between values (``d_model``
    divisible by ``heads``) are checked on whole configs: a sampled combination that breaks
    one fails its trial with the reason."""
    from pydantic import TypeAdapter

    try:
        TypeAdapter(param.type).validate_python(value)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {short_repr(value)} is invalid: "
                          f"{pydantic_message(exc.errors()[0] | {'loc': ()})}.") from None
    why = value_problem(param, value)
    if why:
        raise ConfigError(f"{where}: {why}.")


def _width_values(param: Param, override: Any, where: str) -> list[int]:
    rng = parse_range(override, int, where) if override is not None else param.range
    if isinstance(rng, Choice):
        values = rng.options
    elif isinstance(rng, IntRange):
        values = tuple(range(rng.low, rng.high + 1, rng.step))
    else:
        raise ConfigError(
            f"{where}: '{param.name}' declares no integer range to match parameter counts over; "
            f"list the widths to try, e.g. search: {{{param.name}: [32, 64, 128]}}."
        )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{where}: widths must be integers; got {list(values)!r}.")
    return sorted(set(values))


def candidate_space(registry: Registry, cand: Candidate, index: int, match: str | None) -> CandidateSpace:
    """A candidate's search space; ``match`` (``params`` or ``state_size``) when the study
    sets each candidate's width to match a budget."""
    where = f"candidates[{index}].model"
    cand = recall.with_width(registry, cand, where)  # a sweep study's width, fixed
    width: str | None = None
    widths: list[int] = []
    if match:
        budget = f"budget.{match}"
        try:
            mspec = registry.get("model", cand.model.name)
        except HarnessError as exc:
            raise ConfigError(f"{where}.name: {exc}") from None
        width = mspec.width_param
        if width is None:
            raise ConfigError(
                f"{where}.name: {budget} matches candidates' widths, but model '{mspec.name}' "
                f"declares no width_param, so its width cannot be adjusted. Remove {budget} or "
                f"drop this candidate (or ask the plugin author to set width_param)."
            )
        if width in cand.model.params:
            raise ConfigError(
                f"{where}.params.{width}: {budget} sets the width; remove the fixed value "
                f"(to restrict the widths tried, list them under search.{width})."
            )
        declared = {p.name: p for p in declared_params(mspec.config)}
        widths = _width_values(declared[width], cand.model.search.get(width), f"{where}.search.{width}")
    model = component_space(registry, "model", cand.model, where, width)
    roles = {}
    for role in ("attention", "mixer", "position"):
        comp = getattr(cand.model, role)
        roles[role] = None if comp is None else component_space(registry, role, comp, f"{where}.{role}")
    return CandidateSpace(index, cand, model, width_param=width, widths=widths, **roles)
