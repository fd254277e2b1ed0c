"""The validated study: a study config checked against the registry, turning trials into
run configs.

Owns :func:`validate` (everything that can be checked before a trial runs: names, fixed
values, ranges, pairings, task compatibility, the objective's evaluation length, the
training settings a study may fix or search), :class:`StudySpace` (one trial's run config,
and parameter-count matching: the width whose model is closest to ``budget.params``), and
:func:`load_registry` (the installed plugins plus the study's local plugin files).
"""

from __future__ import annotations

import copy
import difflib
import json
import typing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.config import TrainConfig, format_validation_error
from harness.errors import ConfigError, HarnessError, PluginError, short_repr, shorten
from harness.params import Choice, Range, resolve, unknown_params_error
from harness.registry.specs import Registry
from harness.study import grid, recall, transfer
from harness.study.budget import check_one_step, run_budget
from harness.study.candidates import (
    CandidateSpace,
    ComponentSpace,
    candidate_space,
    parse_range,
    range_values,
)
from harness.study.schema import MAXIMIZE, MINIMIZE, StudyConfig

#: Training settings a study may search, with their type.
TRAIN_SEARCHABLE: dict[str, type] = {
    "lr": float, "weight_decay": float, "warmup_steps": int, "batch_size": int,
    "label_smoothing": float, "grad_clip": float, "optimizer": str, "schedule": str,
    "momentum": float, "min_lr_ratio": float,
}
#: The study's search keys of μP's multipliers (``mup.output_mult``: ``model.mup``'s fields).
MUP_PREFIX = "mup."
#: A candidate whose uncounted work exceeds this share of the counted FLOPs gets a note.
UNCOUNTED_NOTE = 0.05
#: Training settings the protocol sets; the YAML must not.
TRAIN_PROTOCOL = {
    "max_steps": "budget.steps", "max_time_s": "budget.time_per_run_s (or budget.seconds)",
    "max_flops": "budget.flops", "max_tokens": "budget.tokens", "flops_count": "budget.count",
    "seed": "seed (tuning) and confirm.seeds", "data_seed": "data_seed",
}


def load_registry(config: StudyConfig) -> Registry:
    """Every installed plugin plus the study's local plugin files (which must load)."""
    from harness.registry import loader

    registry = loader.load(config.plugins)
    local = {Path(p).stem for p in config.plugins}
    broken = [f for f in registry.failures if f.plugin in local]
    if broken:
        raise PluginError(
            "a plugin file named in the study failed to load: "
            + "; ".join(f.describe() for f in broken) + ". Fix the file or remove it from `plugins:`."
        )
    return registry



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
        raise ConfigError(format_validation_error(exc, "the study", TrainConfig, prefix="train.")) from None
    _check_devices(config.train)
    ranges = {}
    for key, raw in config.search.items():
        if key.startswith(MUP_PREFIX):
            continue  # model.mup's multipliers: _parse_mup
        if key not in TRAIN_SEARCHABLE:
            raise unknown_params_error([key], sorted(TRAIN_SEARCHABLE), "search")
        if key in config.train:
            raise ConfigError(f"search.{key}: also fixed under train; keep one.")
        kind = TRAIN_SEARCHABLE[key]
        ranges[key] = _checked_range(key, raw, kind if kind in (int, float) else None, TrainConfig, key)
    return ranges


def _checked_range(key: str, raw: Any, kind: type | None, schema: Any, name: str) -> Range:
    """``search.KEY``'s range, every value in it checked as ``schema``'s field ``name``."""
    rng = parse_range(raw, kind, f"search.{key}")
    for value in range_values(rng):
        try:
            schema.model_validate({name: value})
        except ValidationError as exc:
            detail = format_validation_error(exc, "the study", schema).split(f"{name}: ", 1)[-1]
            raise ConfigError(f"search.{key}: {value!r} is invalid: {detail}") from None
    return rng


def _parse_mup(config: StudyConfig) -> dict[str, Range]:
    """The study's ranges of μP's base-width multipliers (``search: {mup.output_mult: ...}``),
    each value checked as a run config's ``model.mup`` would be, and only for a study whose
    candidates are all in μP (``model.parametrization: mup``, ``transfer`` or a scaling study's
    rule ``mup``)."""
    from harness.config import MupMultipliers

    ranges: dict[str, Range] = {}
    fields = MupMultipliers.model_fields
    for key, raw in config.search.items():
        if not key.startswith(MUP_PREFIX):
            continue
        name = key[len(MUP_PREFIX):]
        if name not in fields:
            raise unknown_params_error([key], sorted(MUP_PREFIX + f for f in fields), "search")
        numeric = fields[name].annotation is not bool
        ranges[name] = _checked_range(key, raw, float if numeric else None, MupMultipliers, name)
    for i, cand in enumerate(config.candidates):
        fixed = cand.model.mup is not None
        if not (ranges or fixed) or in_mup(config, cand):
            continue
        where = f"search.{MUP_PREFIX}{next(iter(ranges))}" if ranges else f"candidates[{i}].model.mup"
        raise ConfigError(f"{where}: μP's multipliers apply to a model in μP, and candidate "
                          f"'{cand.name}' is in the standard parametrization; set its "
                          f"model.parametrization: mup, or tune at a base width with the study's "
                          f"transfer: {{rule: mup, base: ...}}, or remove it.")
    return ranges


def in_mup(config: StudyConfig, cand: Any) -> bool:
    """Whether a candidate's runs are in μP (its own parametrization, or the study's transfer)."""
    return cand.model.parametrization == "mup" or config.transfer is not None


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
    #: ranges of μP's multipliers (``search: {mup.output_mult: ...}``), by ``model.mup`` field
    mup_ranges: dict[str, Range] = field(default_factory=dict)
    _tasks: dict[str, Any] = field(default_factory=dict, repr=False)  # task_for's cache

    @property
    def objective_length(self) -> int:
        return self.config.objective.length or self.train_length

    def train_length_of(self, cand: CandidateSpace) -> int:
        """A candidate's training length: its own task params may set another than the study's."""
        if "length" not in cand.candidate.task:
            return self.train_length
        return int(self.task_for(self.task_config(cand)["params"]).train_length)

    def objective_length_of(self, cand: CandidateSpace) -> int:
        """The length a candidate's objective is read at: ``objective.length``, else the
        candidate's own training length."""
        return self.config.objective.length or self.train_length_of(cand)

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
        train.update(seed=seed, data_seed=cfg.data_seed, **run_budget(cfg, cand))
        if cand.candidate.cell is not None and cand.candidate.cell.lr is not None:
            train["lr"] = cand.candidate.cell.lr  # the scaling study's transfer rule
        train.setdefault("progress", False)
        train.setdefault("devices", 1)  # "auto" would launch one process per GPU
        model: dict[str, Any] = {"name": cand.model.spec.name, "params": values["model"]}
        for role in ("attention", "mixer", "position"):
            comp = getattr(cand, role)
            if comp is not None:
                model[role] = {"name": comp.spec.name, "params": values[role]}
        model.update(_fixed_roles(cand))
        model.update(_parametrization(cand))
        for key, rng in self.mup_ranges.items():  # a study of μP's multipliers
            model.setdefault("mup", {})[key] = (rng.suggest(trial, MUP_PREFIX + key) if trial is not None
                                                else _first(rng))
        if cand.candidate.model.preset:
            model["preset"] = cand.candidate.model.preset
        run = {"task": self.task_config(cand), "model": model, "train": train,
               "plugins": list(cfg.plugins)}
        if cand.width_param is not None:
            width, _ = self.match_width(cand, run)
            model["params"][cand.width_param] = width
        if cfg.transfer is not None:  # tune at the base shape (harness.study.transfer)
            tuning = transfer.tuning_run(run, cand, cfg.transfer.base)
            tuning["train"] = transfer.run_budget(self, cand, run)
            return tuning
        return run

    def confirm_run_config(self, best_run: dict[str, Any], seed: int,
                           cand: CandidateSpace | None = None) -> dict[str, Any]:
        """A confirmation run: the best tuning configuration re-run with training seed
        ``seed`` (initialisation and data order) and, with ``confirm.vary_data``, a fresh data
        sample (:meth:`StudyConfig.confirm_data_seed`). With ``transfer``, at the candidate's
        own width (``cand``'s) under the study's budget."""
        run = copy.deepcopy(best_run)
        if self.config.transfer is not None and cand is not None:
            run = transfer.full_width_run(run, self.base_run_config(cand))
            if cand.width_param is not None:
                run["model"]["params"][cand.width_param], _ = self.match_width(cand, run)
            for key in ("max_steps", "max_flops", "max_tokens"):
                run["train"].pop(key, None)
            run["train"].update(run_budget(self.config, cand))
        run["train"]["seed"] = seed
        run["train"]["data_seed"] = self.config.confirm_data_seed(seed)
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
            raise ConfigError(f"task '{spec.name}' could not be built: {shorten(str(exc), 300)}. Check "
                              f"task.params.") from None

    def base_run_config(self, cand: CandidateSpace) -> dict[str, Any]:
        """Task and model of a candidate: its fixed values and the first option of each
        range the YAML gives (plugin defaults elsewhere); the configuration validated
        before a study starts."""
        def entry(comp: ComponentSpace) -> dict[str, Any]:
            params = dict(comp.fixed) | {k: _first(r) for k, r in comp.ranges.items()}
            return {"name": comp.spec.name, "params": params}

        model = entry(cand.model)
        for comp in (cand.attention, cand.mixer, cand.position):
            if comp is not None:
                model[comp.role] = entry(comp)
        model.update(_fixed_roles(cand))
        model.update(_parametrization(cand))
        if cand.candidate.model.preset:
            model["preset"] = cand.candidate.model.preset
        return {"task": self.task_config(cand), "model": model}

    def task_config(self, cand: CandidateSpace) -> dict[str, Any]:
        """The study's task with the candidate's own task params over its params."""
        task = self.config.task.model_dump()
        task["params"] = {**task["params"], **cand.candidate.task}
        return task

    def task_for(self, params: dict[str, Any]) -> Any:
        """The study's task built with these params (cached; the study's own: :attr:`task`)."""
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in self._tasks:
            spec = self.registry.get("task", self.config.task.name)
            try:
                self._tasks[key] = spec.build(resolve(spec.config, params, "task.params"),
                                              seed=self.config.data_seed)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"task '{spec.name}' could not be built with {short_repr(params, 300)}: "
                                  f"{shorten(str(exc), 300)}.") from None
        return self._tasks[key]

    def measure(self, run: dict[str, Any], what: str = "params") -> int | None:
        """The parameter count (``params``) or decoding-state size at the training length
        (``state_size``) of the model a run config builds; None if it is invalid."""
        from harness.config import parse_run_config
        from harness.run.build import build_model, task_info
        from harness.run.plan import plan
        from harness.run.record import decoding_state_size

        # the parametrization changes no count: the standard model builds once instead of thrice
        model = {k: v for k, v in run["model"].items() if k not in ("parametrization", "base")}
        try:
            p = plan(parse_run_config({"task": run["task"], "model": model}), self.registry)
            params = run["task"].get("params", {})
            info = task_info(p, self.task if params == self.config.task.params else self.task_for(params))
            model = build_model(p, info)
        except HarnessError:
            return None
        if what == "state_size":
            return decoding_state_size(model, info.max_length)
        return int(sum(t.numel() for t in model.parameters() if t.requires_grad))

    def count_params(self, run: dict[str, Any]) -> int | None:
        return self.measure(run, "params")

    def match_width(self, cand: CandidateSpace, run: dict[str, Any]) -> tuple[int, int]:
        """The width (from ``cand.widths``) whose model comes closest to the study's width
        target (parameters or decoding-state size), and that value. Binary search: both grow
        with width; invalid widths are skipped."""
        assert cand.width_param is not None and self.config.width_target is not None
        what, target = self.config.width_target
        counts: dict[int, int | None] = {}

        def count(i: int) -> int | None:
            width = cand.widths[i]
            if width not in counts:
                trial_run = copy.deepcopy(run)
                trial_run["model"]["params"][cand.width_param] = width
                counts[width] = self.measure(trial_run, what)
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
        if not valid and what == "state_size" and self.count_params(run) is not None:
            raise ConfigError(
                f"candidates[{cand.index}] ({cand.name}): budget.state_size matches decoding-state "
                f"sizes, but model '{cand.model.spec.name}' declares none (no state_size: it does "
                f"not decode incrementally); match by budget.params instead or drop the candidate."
            )
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


def _parametrization(cand: CandidateSpace) -> dict[str, Any]:
    """The candidate's model.parametrization and base as run-config entries (none when standard)."""
    m = cand.candidate.model
    if m.parametrization == "standard":
        return {}
    return {"parametrization": m.parametrization, **({"base": dict(m.base)} if m.base else {}),
            **({"mup": m.mup.model_dump()} if m.mup is not None else {})}


def _first(rng: Range) -> Any:
    return rng.options[0] if isinstance(rng, Choice) else rng.low


def _check_plan(space: StudySpace, cand: CandidateSpace) -> None:
    """Resolve the candidate's base configuration (names, pairing, task compatibility); with
    parameter matching, any one width that makes it valid will do."""
    from harness.config import parse_run_config
    from harness.run.plan import plan

    first_error = None
    widths: list[int | None] = list(cand.widths) or [None]
    for width in widths:
        run = {**space.base_run_config(cand), "train": dict(space.config.train)}  # strategy...
        if width is not None:
            run["model"]["params"][str(cand.width_param)] = width
        try:
            resolved = plan(parse_run_config(run), space.registry)
        except HarnessError as exc:
            first_error = first_error or exc
            continue
        from harness.run.sanity import meaningless

        space.notes += [f"warning: candidate {cand.name}: {text}" for text in meaningless(resolved)
                        if f"warning: candidate {cand.name}: {text}" not in space.notes]
        return
    raise ConfigError(f"candidates[{cand.index}] ({cand.name}){_size_hint(space, cand)}: "
                      f"{first_error}") from None


def _size_hint(space: StudySpace, cand: CandidateSpace) -> str:
    """Which size of a scaling study's schedule a candidate is (for its errors)."""
    cell, scaling = cand.candidate.cell, space.config.scaling
    if cell is None or scaling is None:
        return ""
    return f", scaling.sizes[{cell.size}] = {scaling.sizes[cell.size]}"


def _check_candidate_task(space: StudySpace, cand: CandidateSpace) -> None:
    """A candidate's own task params: known to the task, and the task builds with them (a
    prepared corpus that is not there fails here, before any trial)."""
    if not cand.candidate.task:
        return
    where = f"candidates[{cand.index}].task"
    spec = space.registry.get("task", space.config.task.name)
    params = space.task_config(cand)["params"]
    from harness.run.plan import documents_of

    own = resolve(spec.config, params, where)
    study = resolve(spec.config, space.config.task.params, "task.params")
    if documents_of(own) != documents_of(study):
        raise ConfigError(f"{where}: documents differs from the study's task.params: every candidate "
                          f"must see documents the same way (packed or separate); set it once in "
                          f"task.params.")
    task = space.task_for(params)
    length = space.config.objective.length
    if length is not None and length not in task.eval_lengths:
        raise ConfigError(f"{where}: objective.length {length} is not one of this candidate's "
                          f"evaluation lengths ({', '.join(map(str, task.eval_lengths))}).")


def _same_data(space: StudySpace) -> bool:
    """Whether the task draws the same training examples for another data seed."""
    spec = space.registry.get("task", space.config.task.name)
    params = resolve(spec.config, space.config.task.params, "task.params")
    other = spec.build(params, seed=space.config.data_seed + 1)
    n = space.train_length
    return list(other.examples("train", n)[:16]) == list(space.task.examples("train", n)[:16])


#: what every run logs per validation length (harness.run.system.summarize)
BASE_METRICS = ("loss", "acc", "exact")
PERPLEXITY_METRICS = ("ppl", "bpc")


def logged_metrics(task: Any) -> set[str] | None:
    """The validation metrics a task's runs log: the harness's own and those the task declares
    in ``extra_metric_names``; None when the task computes extra metrics without declaring
    their names (nothing can be checked)."""
    from harness.data.tasks import Task

    declared = getattr(task, "extra_metric_names", None)
    if declared is None:
        if any(getattr(type(task), hook) is not getattr(Task, hook)
               for hook in ("extra_metrics", "metrics_from_statistics")):
            return None
        declared = ()
    return {*BASE_METRICS, *(PERPLEXITY_METRICS if task.report_perplexity else ()),
            *(("bpb",) if getattr(task, "token_bytes", None) is not None else ()), *declared}


def validate(config: StudyConfig, registry: Registry) -> StudySpace:
    """Check everything that can be checked before a trial runs: names, fixed values, ranges,
    pairings, task compatibility, the objective's evaluation length, parameter matching."""
    try:
        tspec = registry.get("task", config.task.name)
    except HarnessError as exc:
        raise ConfigError(f"task.name: {exc}") from None
    resolve(tspec.config, config.task.params, "task.params")
    train_ranges = _parse_train(config)
    match = config.width_target[0] if config.width_target else None
    cands = [candidate_space(registry, c, i, match) for i, c in enumerate(config.candidates)]
    space = StudySpace(config, registry, cands, train_ranges, 0, (), mup_ranges=_parse_mup(config))
    for cand in cands:
        _check_plan(space, cand)
    transfer.check_space(space)
    space.train_length, space.eval_lengths = space.task.train_length, tuple(space.task.eval_lengths)
    logged = logged_metrics(space.task)
    if logged is not None and config.objective.metric not in logged and not config.objective.downstream:
        metric = config.objective.metric
        close = difflib.get_close_matches(metric, sorted(logged), n=1) or [
            m for m in sorted(logged) if metric.startswith(m) or m.startswith(metric)][:1]
        raise ConfigError(
            f"objective.metric: task '{tspec.name}' does not log '{config.objective.metric}'"
            + (f" (did you mean '{close[0]}'?)" if close else "")
            + f"; its runs log {', '.join(sorted(logged))} (as val/METRIC). Every trial would "
            f"fail: nothing was created."
        )
    if config.objective.direction is None:
        raise ConfigError(
            f"objective.direction is required for metric '{config.objective.metric}' (maximize "
            f"or minimize): the harness knows the direction of "
            f"{', '.join(sorted(MINIMIZE | MAXIMIZE))} only. Add direction: to objective.")
    length = config.objective.length
    if length is not None and length not in space.eval_lengths:
        raise ConfigError(
            f"objective.length: {length} is not an evaluation length of task '{tspec.name}' "
            f"({', '.join(map(str, space.eval_lengths))}); add it to task.params.eval_lengths."
        )
    for cand in cands:
        _check_candidate_task(space, cand)
    grid.check(space)
    if config.multi_objective and config.pruner.name != "none":
        space.notes.append(
            f"pruner '{config.pruner.name}' disabled: Optuna does not prune multi-objective studies"
        )
    elif config.pruner.name != "none" and space.objective_length != space.train_length \
            and not config.objective.downstream and config.objective.over == "length":
        space.notes.append(
            f"pruner '{config.pruner.name}' compares tuning trials by val/{config.objective.metric} "
            f"at the objective's length {space.objective_length}: each tuning run validates there "
            f"too while it trains (besides its training length {space.train_length})")
    space.notes += recall.grid_notes(space)
    if config.confirm.vary_data and _same_data(space):
        space.notes.append(f"confirm.vary_data has no effect: the data of task "
                           f"'{config.task.name}' does not depend on its seed")
    if config.cost is not None and config.cost.metric == "peak_memory":
        space.notes.append("peak_memory on CPU is the run's peak resident memory (it "
                           "includes the interpreter); on GPUs the run's peak allocation")
    if match:
        for cand in cands:
            space.match_width(cand, space.base_run_config(cand))
    _check_compute(space)
    return space


def _check_compute(space: StudySpace) -> None:
    """Under a compute budget, every candidate's base configuration buys at least one step
    (measured: :func:`harness.study.budget.check_one_step`); runs of fewer than 50 steps may
    land more than 1% off their budget (steps are whole), which the report flags."""
    if space.config.budget.currency not in ("flops", "tokens") and space.config.scaling is None:
        return
    from harness.config import parse_run_config
    from harness.run.plan import plan
    from harness.run.sanity import MAX_SENSIBLE_PASSES, corpus_passes

    few, missed, repeated = [], [], []
    corpus = 0
    for cand in space.candidates:
        run = space.run_config(cand, None, seed=space.config.seed)
        steps, share = check_one_step(space, cand, run)
        if steps is not None and steps < 50:
            few.append(f"{cand.name} ({steps})")
        passes = None
        if steps is not None:
            resolved = plan(parse_run_config(run), space.registry)
            passes = corpus_passes(resolved.task.params, steps, resolved.config.train.batch_size)
        if passes is not None and passes[0] > MAX_SENSIBLE_PASSES:
            repeated.append(f"{cand.name} ({passes[0]:.0f}x)")
            corpus = passes[1]
        if share is not None and share > UNCOUNTED_NOTE and space.config.budget.count == "matmul":
            missed.append(f"{cand.name} ({share:.0%})")
    if missed:
        space.notes.append(
            "FLOP budgets count matrix products only; the element-wise and FFT work the counter "
            "misses is more than " f"{UNCOUNTED_NOTE:.0%} of the counted for: " + ", ".join(missed)
            + ": at equal counted FLOPs these do more work (budget.count: all counts it)")
    if few:
        space.notes.append("compute budgets that buy fewer than 50 steps land up to 1/(2 steps) "
                           "off their budget (steps are whole): " + ", ".join(few))
    if repeated:
        space.notes.append(
            f"warning: the compute budgets read the corpus's train split ({corpus:,} tokens) more "
            f"than {MAX_SENSIBLE_PASSES} times over for: " + ", ".join(repeated) + ". Past a few "
            "passes the loss also measures memorisation of a small text; prepare a larger corpus "
            "(harness data prepare ...; task.params.path)")
