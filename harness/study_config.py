"""Study definitions: the YAML schema, its validation against the registry, the search space.

A study compares candidates (a model with its attention variant and position scheme) on one
task under one protocol::

    name: quickstart
    task: {name: copy, params: {length: 8, vocab: 8}}
    candidates:
      - name: mha_sinusoidal
        model:
          name: transformer
          params: {layers: 1}                  # fixed values, never searched
          search: {d_model: [32, 64]}          # narrows the plugin's declared range
          attention: {name: multi_head}
          position: {name: sinusoidal}
    objective: {metric: acc, length: 16}       # read at evaluation length 16
    search: {lr: {low: 1.0e-4, high: 3.0e-3, log: true}}   # shared by every candidate
    budget: {trials: 4, steps: 300}            # the same for every candidate
    confirm: {seeds: 3, baseline: mha_sinusoidal}

Every hyper-parameter a plugin declares with a range is searched unless the YAML fixes it
(``params``) or switches the declared ranges off (``search_declared: false``); ``search``
replaces a declared range (a list of options, or ``{low, high, log, step}``). The task is
never searched: every candidate sees the same data. Errors name the field
(``candidates[2].model.position.search.base``). A model that declares attention roles may
give a role its own variant (``attention_roles: {cross: {name: additive}}``, as in a run
config); those are fixed choices with fixed params: never searched.
"""

from __future__ import annotations

import copy
import hashlib
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.config import ComponentConfig, TrainConfig, read_yaml
from harness.errors import ConfigError, HarnessError, PluginError
from harness.params import (
    Choice,
    FloatRange,
    IntRange,
    Param,
    Range,
    declared_params,
    resolve,
    suggest,
    unknown_params_error,
)
from harness.registry import Registry

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
#: Metrics whose direction is known; any other metric needs ``objective.direction``.
MINIMIZE = frozenset({"loss", "ppl", "bpc", "per", "wer", "cer", "error"})
MAXIMIZE = frozenset({"acc", "exact", "bleu", "f1"})
#: Cost objectives: MLflow metric keys (first one present wins) and direction.
COSTS: dict[str, tuple[tuple[str, ...], str]] = {
    "tokens_per_s": (("cost/train_tokens_per_s",), "maximize"),
    "peak_memory": (("cost/peak_gpu_mem_mb", "cost/peak_rss_mb"), "minimize"),
    "params": (("cost/params",), "minimize"),
}
#: Training settings a study may search, with their type.
TRAIN_SEARCHABLE: dict[str, type] = {
    "lr": float, "weight_decay": float, "warmup_steps": int, "batch_size": int,
    "label_smoothing": float, "grad_clip": float,
}
#: Training settings the protocol sets; the YAML must not.
TRAIN_PROTOCOL = {
    "max_steps": "budget.steps", "max_time_s": "budget.time_per_run_s",
    "seed": "seed (tuning) and confirm.seeds", "data_seed": "data_seed",
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchComponent(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict, description="fixed values")
    search: dict[str, Any] = Field(default_factory=dict, description="ranges replacing the declared ones")
    search_declared: bool = Field(True, description="also search the other declared ranges")


class CandidateModel(SearchComponent):
    attention: SearchComponent | None = None
    position: SearchComponent | None = None
    attention_roles: dict[str, ComponentConfig] = Field(
        default_factory=dict, exclude_if=lambda roles: not roles,  # keeps old fingerprints
        description="per-role attention variants, fixed (their params are never searched)",
    )


class Candidate(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    model: CandidateModel


class Objective(Strict):
    metric: str = "acc"
    direction: Literal["maximize", "minimize"] | None = None
    length: int | None = Field(None, ge=1, description="evaluation length (default: training length)")

    @model_validator(mode="after")
    def _infer_direction(self) -> Objective:
        if self.direction is None:
            if self.metric in MINIMIZE:
                self.direction = "minimize"
            elif self.metric in MAXIMIZE:
                self.direction = "maximize"
            else:
                raise ValueError(
                    f"direction is required for metric '{self.metric}' (maximize or minimize)"
                )
        return self


class CostObjective(Strict):
    metric: Literal["tokens_per_s", "peak_memory", "params"]


class Budget(Strict):
    trials: int = Field(ge=1, description="tuning trials per candidate")
    steps: int = Field(ge=1, description="optimizer steps of every run")
    params: int | None = Field(None, ge=1, description="match candidates' widths to this parameter count")
    time_per_run_s: float | None = Field(None, gt=0, description="wall-clock cap of every run")
    time_total_s: float | None = Field(None, gt=0, description="a worker starts no run after this")


class SamplerConfig(Strict):
    name: Literal["tpe", "random", "nsgaii"] = "tpe"
    seed: int | None = 0
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the sampler")


class PrunerConfig(Strict):
    name: Literal["none", "median", "hyperband"] = "median"
    startup_trials: int = Field(2, ge=0, description="median: trials completed before pruning starts")
    warmup_steps: int = Field(0, ge=0, description="median: no pruning before this step")
    reduction_factor: int = Field(3, ge=2, description="hyperband")


class ConfirmConfig(Strict):
    seeds: int = Field(3, ge=1, description="fresh seeds per candidate's best configuration")
    baseline: str | None = Field(None, description="candidate the others are tested against")
    confidence: float = Field(0.95, gt=0, lt=1)


class ResumeConfig(Strict):
    heartbeat_s: int = Field(30, ge=1, description="a running trial records a heartbeat this often")
    grace_s: int = Field(120, ge=1, description="a trial without heartbeat for this long is retried")
    max_retry: int = Field(2, ge=0, description="retries of an interrupted trial")
    poll_s: float = Field(2.0, gt=0, description="how often an idle worker checks for work")


class StudyTracking(Strict):
    experiment: str | None = None  # default: the study name


class StudyConfig(Strict):
    kind: Literal["study"] = "study"
    name: str | None = Field(None, pattern=NAME_PATTERN)
    description: str = ""
    task: ComponentConfig
    candidates: list[Candidate] = Field(min_length=1)
    objective: Objective = Field(default_factory=Objective)
    cost: CostObjective | None = None
    train: dict[str, Any] = Field(default_factory=dict, description="fixed training settings")
    search: dict[str, Any] = Field(default_factory=dict, description="shared training ranges")
    budget: Budget
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    pruner: PrunerConfig = Field(default_factory=PrunerConfig)
    confirm: ConfirmConfig = Field(default_factory=ConfirmConfig)
    resume: ResumeConfig = Field(default_factory=ResumeConfig)
    tracking: StudyTracking = Field(default_factory=StudyTracking)
    seed: int = Field(0, description="training seed of every tuning trial")
    data_seed: int = Field(0, description="task data (the same for every run)")
    plugins: list[str] = Field(default_factory=list, description="local plugin .py files")

    @model_validator(mode="after")
    def _names(self) -> StudyConfig:
        names = [c.name for c in self.candidates]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"candidate names must be unique; repeated: {', '.join(dup)}")
        if self.confirm.baseline is not None and self.confirm.baseline not in names:
            raise ValueError(
                f"confirm.baseline '{self.confirm.baseline}' is not a candidate "
                f"(candidates: {', '.join(names)})"
            )
        return self

    @property
    def multi_objective(self) -> bool:
        return self.cost is not None

    @property
    def baseline(self) -> str:
        return self.confirm.baseline or self.candidates[0].name

    def directions(self) -> list[str]:
        dirs = [str(self.objective.direction)]
        if self.cost is not None:
            dirs.append(COSTS[self.cost.metric][1])
        return dirs

    def confirm_seeds(self) -> list[int]:
        """Fresh seeds: never the tuning seed."""
        return [self.seed + 1 + i for i in range(self.confirm.seeds)]

    def protocol_dict(self) -> dict[str, Any]:
        """What a resumed study must not change (everything but runtime settings)."""
        return self.model_dump(mode="json", exclude={"resume": True, "plugins": True, "budget": {"time_total_s"}})

    def fingerprint(self) -> str:
        text = json.dumps(self.protocol_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- loading -----------------------------------------------------------------------------
def format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_study_config(data: Mapping[str, Any], source: str = "study") -> StudyConfig:
    try:
        return StudyConfig.model_validate(dict(data))
    except ValidationError as exc:
        parts = []
        for err in exc.errors()[:5]:
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check the spelling; see studies/quickstart.yaml for the fields)"
            elif err["type"] == "missing":
                msg = "required field is missing"
            parts.append(f"{format_loc(tuple(err['loc']))}: {msg}")
        more = f" (and {len(exc.errors()) - 5} more)" if len(exc.errors()) > 5 else ""
        raise ConfigError(f"invalid study in {source}: " + "; ".join(parts) + more + ".") from None


def load_study_config(path: str | Path, name: str | None = None) -> StudyConfig:
    """Read a study YAML; the study's name defaults to the file's stem."""
    data = read_yaml(path)
    if data.get("kind", "study") != "study":
        raise ConfigError(f"{path} is a '{data.get('kind')}' config, not a study; pass a study YAML.")
    base = Path(path).resolve().parent
    data["plugins"] = [str((base / p).resolve()) for p in data.get("plugins") or []]
    if name is not None:
        data["name"] = name
    data.setdefault("name", Path(path).stem)
    return parse_study_config(data, str(path))


def load_registry(config: StudyConfig) -> Registry:
    """Every installed plugin plus the study's local plugin files (which must load)."""
    from harness import plugins

    registry = plugins.load(config.plugins)
    local = {Path(p).stem for p in config.plugins}
    broken = [f for f in registry.failures if f.plugin in local]
    if broken:
        raise PluginError(
            "a plugin file named in the study failed to load: "
            + "; ".join(f.describe() for f in broken) + ". Fix the file or remove it from `plugins:`."
        )
    return registry


# -- search space ------------------------------------------------------------------------
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
    width_param: str | None = None  # set when the study matches parameter counts
    widths: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.candidate.name

    def components(self) -> list[ComponentSpace]:
        return [c for c in (self.model, self.attention, self.position) if c is not None]

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
                f"step (integers); got {raw!r}."
            )
        low, high, log = raw["low"], raw["high"], bool(raw.get("log", False))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise ConfigError(f"{where}: low and high must be numbers; got {low!r} and {high!r}.")
        if low > high or (log and low <= 0):
            raise ConfigError(f"{where}: need low <= high (and low > 0 with log: true); got {raw!r}.")
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
        f"{where}: {raw!r} is not a range. Give a list of options or {{low, high}}; to fix a "
        f"value, put it under params instead."
    )


def _range_values(rng: Range) -> list[Any]:
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
        for value in _range_values(rng):
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
        raise ConfigError(f"{where}: {value!r} is invalid: {exc.errors()[0]['msg']}.") from None


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


def candidate_space(registry: Registry, cand: Candidate, index: int, match_params: bool) -> CandidateSpace:
    where = f"candidates[{index}].model"
    width: str | None = None
    widths: list[int] = []
    if match_params:
        try:
            mspec = registry.get("model", cand.model.name)
        except HarnessError as exc:
            raise ConfigError(f"{where}.name: {exc}") from None
        width = mspec.width_param
        if width is None:
            raise ConfigError(
                f"{where}.name: budget.params matches candidates by parameter count, but model "
                f"'{mspec.name}' declares no width_param, so its width cannot be adjusted. Remove "
                f"budget.params or drop this candidate (or ask the plugin author to set width_param)."
            )
        if width in cand.model.params:
            raise ConfigError(
                f"{where}.params.{width}: budget.params sets the width; remove the fixed value "
                f"(to restrict the widths tried, list them under search.{width})."
            )
        declared = {p.name: p for p in declared_params(mspec.config)}
        widths = _width_values(declared[width], cand.model.search.get(width), f"{where}.search.{width}")
    model = component_space(registry, "model", cand.model, where, width)
    attention = position = None
    if cand.model.attention is not None:
        attention = component_space(registry, "attention", cand.model.attention, f"{where}.attention")
    if cand.model.position is not None:
        position = component_space(registry, "position", cand.model.position, f"{where}.position")
    return CandidateSpace(index, cand, model, attention, position, width, widths)


def _check_devices(train: dict[str, Any]) -> None:
    """Several devices in a trial need a launcher that stays in the worker's process."""
    devices = train.get("devices", 1)
    many = (devices in ("auto", -1, "-1") or (isinstance(devices, list) and len(devices) > 1)
            or (str(devices).isdigit() and int(devices) > 1))
    strategy = str(train.get("strategy", "auto"))
    if many and not any(k in strategy for k in ("spawn", "fork", "notebook")):
        raise ConfigError(
            f"train.strategy: '{strategy}' with devices {devices!r} would make Lightning re-run "
            f"the command once per device, and each copy would act as another study worker. "
            f"Use strategy: ddp_spawn (or ddp_fork) for several devices in one trial, or "
            f"devices: 1 with one worker per device."
        )


def _parse_train(config: StudyConfig) -> dict[str, Range]:
    for key in config.train:
        if key in TRAIN_PROTOCOL:
            raise ConfigError(f"train.{key}: set by {TRAIN_PROTOCOL[key]} in a study; remove it here.")
    try:
        TrainConfig.model_validate(config.train)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"train.{format_loc(tuple(err['loc']))}: {err['msg']}.") from None
    _check_devices(config.train)
    ranges = {}
    for key, raw in config.search.items():
        if key not in TRAIN_SEARCHABLE:
            raise unknown_params_error([key], sorted(TRAIN_SEARCHABLE), "search")
        if key in config.train:
            raise ConfigError(f"search.{key}: also fixed under train; keep one.")
        rng = parse_range(raw, TRAIN_SEARCHABLE[key], f"search.{key}")
        for value in _range_values(rng):
            try:
                TrainConfig.model_validate({key: value})
            except ValidationError as exc:
                raise ConfigError(f"search.{key}: {value!r} is invalid: {exc.errors()[0]['msg']}.") from None
        ranges[key] = rng
    return ranges


# -- the validated study -----------------------------------------------------------------
@dataclass
class StudySpace:
    """A study config validated against the registry; turns trials into run configs."""

    config: StudyConfig
    registry: Registry
    candidates: list[CandidateSpace]
    train_ranges: dict[str, Range]
    train_length: int
    eval_lengths: tuple[int, ...]
    notes: list[str] = field(default_factory=list)

    @property
    def objective_length(self) -> int:
        return self.config.objective.length or self.train_length

    def candidate(self, name: str) -> CandidateSpace:
        for cand in self.candidates:
            if cand.name == name:
                return cand
        raise ConfigError(f"unknown candidate '{name}'; candidates: {', '.join(c.name for c in self.candidates)}.")

    def run_config(self, cand: CandidateSpace, trial: Any | None, seed: int) -> dict[str, Any]:
        """The run config of one trial (``trial=None``: the plugin defaults), as a dict."""
        cfg = self.config
        values = {c.role: c.sample(trial) for c in cand.components()}
        train = dict(cfg.train)
        for key, rng in self.train_ranges.items():
            train[key] = rng.suggest(trial, f"train.{key}") if trial is not None else _first(rng)
        train.update(max_steps=cfg.budget.steps, seed=seed, data_seed=cfg.data_seed,
                     max_time_s=cfg.budget.time_per_run_s)
        train.setdefault("progress", False)
        train.setdefault("devices", 1)  # "auto" would launch one process per GPU
        model: dict[str, Any] = {"name": cand.model.spec.name, "params": values["model"]}
        for role in ("attention", "position"):
            comp = getattr(cand, role)
            if comp is not None:
                model[role] = {"name": comp.spec.name, "params": values[role]}
        model.update(_fixed_roles(cand))
        run = {"task": cfg.task.model_dump(), "model": model, "train": train,
               "plugins": list(cfg.plugins)}
        if cand.width_param is not None:
            assert cfg.budget.params is not None
            width, _ = self.match_width(cand, run, cfg.budget.params)
            model["params"][cand.width_param] = width
        return run

    # -- parameter-count matching -------------------------------------------------------
    @cached_property
    def task(self) -> Any:
        """The study's task, built once (parameter matching needs its vocabulary)."""
        spec = self.registry.get("task", self.config.task.name)
        params = resolve(spec.config, self.config.task.params, "task.params")
        try:
            return spec.build(params, seed=self.config.data_seed)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"task '{spec.name}' could not be built: {exc}. Check task.params.") from None

    def base_run_config(self, cand: CandidateSpace) -> dict[str, Any]:
        """Task and model of a candidate: its fixed values and the first option of each
        range the YAML gives (plugin defaults elsewhere); the configuration validated
        before a study starts."""
        def entry(comp: ComponentSpace) -> dict[str, Any]:
            params = dict(comp.fixed) | {k: _first(r) for k, r in comp.ranges.items()}
            return {"name": comp.spec.name, "params": params}

        model = entry(cand.model)
        for comp in (cand.attention, cand.position):
            if comp is not None:
                model[comp.role] = entry(comp)
        model.update(_fixed_roles(cand))
        return {"task": self.config.task.model_dump(), "model": model}

    def count_params(self, run: dict[str, Any]) -> int | None:
        """The parameter count of the model a run config builds; None if it is invalid."""
        from harness.build import build_model, plan, task_info
        from harness.config import parse_run_config

        try:
            p = plan(parse_run_config({"task": run["task"], "model": run["model"]}), self.registry)
            return int(sum(t.numel() for t in build_model(p, task_info(p, self.task)).parameters()
                           if t.requires_grad))
        except HarnessError:
            return None

    def match_width(self, cand: CandidateSpace, run: dict[str, Any], target: int) -> tuple[int, int]:
        """The width (from ``cand.widths``) whose model is closest to ``target`` parameters,
        and that count. Binary search: counts grow with width; invalid widths are skipped."""
        assert cand.width_param is not None
        counts: dict[int, int | None] = {}

        def count(i: int) -> int | None:
            width = cand.widths[i]
            if width not in counts:
                trial_run = copy.deepcopy(run)
                trial_run["model"]["params"][cand.width_param] = width
                counts[width] = self.count_params(trial_run)
            return counts[width]

        lo, hi = 0, len(cand.widths) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            probe = next((j for j in [*range(mid, hi), *range(mid - 1, lo, -1)] if count(j) is not None), None)
            if probe is None:
                break
            if typing.cast(int, count(probe)) < target:
                lo = probe
            else:
                hi = probe
        for j in (lo, hi):
            count(j)
        valid = {w: n for w, n in counts.items() if n is not None}
        if not valid:
            raise ConfigError(
                f"candidates[{cand.index}] ({cand.name}): no width in {cand.widths} gives a valid "
                f"model with the other hyper-parameters; check its params and search ranges."
            )
        width = min(valid, key=lambda w: (abs(valid[w] - target), w))
        return width, valid[width]


def _fixed_roles(cand: CandidateSpace) -> dict[str, Any]:
    """The candidate's per-role attention variants as run-config entries (validated with
    the rest of the run config, by ``_check_plan``)."""
    roles = cand.candidate.model.attention_roles
    return {"attention_roles": {r: c.model_dump() for r, c in roles.items()}} if roles else {}


def _first(rng: Range) -> Any:
    return rng.options[0] if isinstance(rng, Choice) else rng.low


def _check_plan(space: StudySpace, cand: CandidateSpace) -> None:
    """Resolve the candidate's base configuration (names, pairing, task compatibility); with
    parameter matching, any one width that makes it valid will do."""
    from harness.build import plan
    from harness.config import parse_run_config

    first_error = None
    widths: list[int | None] = list(cand.widths) or [None]
    for width in widths:
        run = space.base_run_config(cand)
        if width is not None:
            run["model"]["params"][str(cand.width_param)] = width
        try:
            plan(parse_run_config(run), space.registry)
            return
        except HarnessError as exc:
            first_error = first_error or exc
    raise ConfigError(f"candidates[{cand.index}] ({cand.name}): {first_error}") from None


def validate(config: StudyConfig, registry: Registry) -> StudySpace:
    """Check everything that can be checked before a trial runs: names, fixed values, ranges,
    pairings, task compatibility, the objective's evaluation length, parameter matching."""
    try:
        tspec = registry.get("task", config.task.name)
    except HarnessError as exc:
        raise ConfigError(f"task.name: {exc}") from None
    resolve(tspec.config, config.task.params, "task.params")
    train_ranges = _parse_train(config)
    match = config.budget.params is not None
    cands = [candidate_space(registry, c, i, match) for i, c in enumerate(config.candidates)]
    space = StudySpace(config, registry, cands, train_ranges, 0, ())
    for cand in cands:
        _check_plan(space, cand)
    space.train_length, space.eval_lengths = space.task.train_length, tuple(space.task.eval_lengths)
    length = config.objective.length
    if length is not None and length not in space.eval_lengths:
        raise ConfigError(
            f"objective.length: {length} is not an evaluation length of task '{tspec.name}' "
            f"({', '.join(map(str, space.eval_lengths))}); add it to task.params.eval_lengths."
        )
    if config.multi_objective and config.pruner.name != "none":
        space.notes.append(
            f"pruner '{config.pruner.name}' disabled: Optuna does not prune multi-objective studies"
        )
    if config.cost is not None and config.cost.metric == "peak_memory":
        space.notes.append("peak_memory on CPU is the run's peak resident memory (it "
                           "includes the interpreter); on GPUs the run's peak allocation")
    if match:
        for cand in cands:
            assert config.budget.params is not None
            space.match_width(cand, space.base_run_config(cand), config.budget.params)
    return space

