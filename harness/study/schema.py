"""The YAML schema of a study: its pydantic models, their defaults, parsing and loading.

Owns what a study file may say and how a malformed one is reported (errors name the field,
``candidates[2].model.name``). Nothing here knows the registry: checking names, ranges and
pairings against the installed plugins is :mod:`harness.study.candidates` and
:mod:`harness.study.space`. The fingerprint of a study (what a resumed study must not
change) is computed from these models.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from harness.config import (
    MAX_SECONDS,
    MAX_STEPS,
    ComponentConfig,
    ExperimentName,
    MupMultipliers,
    Seed,
    Strict,
    apply_overrides,
    format_validation_error,
    read_yaml,
)
from harness.errors import ConfigError
from harness.keys import Metric, summary_metric

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
#: Study and candidate names become folder names (reports) and Optuna study names.
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
#: Tuning seeds: the sampler of slot ``i`` of candidate ``c`` gets ``seed + 7919 c + i``
#: and confirmation seeds count up from ``seed``: both must stay valid numpy seeds.
StudySeed = Annotated[int, Field(ge=0, le=2**31 - 1)]
#: Metrics whose direction is known; any other metric needs ``objective.direction``.
MINIMIZE = frozenset({"loss", "ppl", "bpc", "bpb", "per", "wer", "cer", "error",
                      "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"})
#: the maximised metrics on sacrebleu's 0-100 scale (the others of MAXIMIZE are fractions)
SCALE_100 = {"bleu": 100.0, "chrf": 100.0}
MAXIMIZE = frozenset({"acc", "exact", "recall", "bleu", "f1", "macro_f1", "chrf", "exact_match", "acc_norm"})
#: An objective of this form is a downstream (lm-eval) metric: ``eval/<task>/<metric>``.
DOWNSTREAM_PREFIX = "eval/"
#: Cost objectives: MLflow metric keys (first one present wins) and direction.
COSTS: dict[str, tuple[tuple[str, ...], str]] = {
    "tokens_per_s": ((Metric.TOKENS_PER_S,), "maximize"),
    "peak_memory": ((Metric.PEAK_GPU_MB, Metric.PEAK_TENSOR_MB), "minimize"),
    "params": ((Metric.PARAMS,), "minimize"),
    "state_size": ((Metric.STATE_SIZE,), "minimize"),
}
#: Costs the architecture fixes (every seed has the same value): a difference needs no test.
DETERMINED_COSTS = frozenset({"params", "state_size"})
#: How reports name each cost (axes, columns).
COST_LABELS: dict[str, str] = {
    "tokens_per_s": "training tokens / s",
    "peak_memory": "peak memory (MB)",
    "params": "parameters",
    "state_size": "decoding state (elements)",
}


class SearchComponent(Strict):
    name: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict, description="fixed values")
    search: dict[str, Any] = Field(default_factory=dict, description="ranges replacing the declared ones")
    search_declared: bool = Field(True, description="also search the other declared ranges")


class CandidateModel(SearchComponent):
    attention: SearchComponent | None = None
    mixer: SearchComponent | None = Field(None, exclude_if=lambda v: v is None)
    position: SearchComponent | None = None
    preset: str | None = Field(None, exclude_if=lambda v: v is None, description="the model's named preset")
    attention_roles: dict[str, ComponentConfig] = Field(
        default_factory=dict, exclude_if=lambda roles: not roles,  # keeps old fingerprints
        description="per-role attention variants, fixed (their params are never searched)",
    )
    parametrization: Literal["standard", "mup"] = Field(
        "standard", exclude_if=lambda v: v == "standard",  # keeps old fingerprints
        description="the run config's model.parametrization (harness.nn.parametrization)")
    base: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, exclude_if=lambda b: not b, description="mup: the model's base shape")
    mup: MupMultipliers | None = Field(
        None, exclude_if=lambda m: m is None,
        description="mup (or a study's transfer): the base-width multipliers, fixed (search them "
                    "with the study's search: {mup.output_mult: ...})")


class ScalingCell(Strict):
    """Where a candidate of a scaling study sits in its grid (set by
    :func:`harness.study.budget.expand`, never written by hand)."""

    base: Name  # the candidate of the YAML
    size: int = Field(ge=0, description="index into scaling.sizes")
    budget: float = Field(gt=0, description="this cell's training FLOPs (or tokens)")
    unit: Literal["flops", "tokens"] = "flops"
    lr: float | None = Field(None, gt=0, description="the learning rate the transfer rule fixes")


class SweptWidth(Strict):
    """The width of a candidate of a ``sweep:`` study (set by
    :func:`harness.study.recall.expand`, never written by hand)."""

    base: Name  # the candidate of the YAML
    width: int = Field(ge=1, le=10**6, description="the model's width_param")


class Sweep(Strict):
    """Every candidate at each width: the metric against decoding-state size (the report's
    recall-versus-state frontier, docs/long_context.md)."""

    widths: list[Annotated[int, Field(ge=1, le=10**6)]] = Field(
        min_length=2, description="values of each candidate's model width_param (d_model, width)")

    @field_validator("widths")
    @classmethod
    def _distinct(cls, widths: list[int]) -> list[int]:
        if len(set(widths)) < len(widths):
            raise ValueError("widths: two widths are the same")
        return sorted(widths)


class Candidate(Strict):
    name: Name
    description: str = ""
    model: CandidateModel
    task: dict[str, Any] = Field(
        default_factory=dict, exclude_if=lambda params: not params,  # keeps old fingerprints
        description="task params this candidate sets over task.params (the task is the "
                    "study's), e.g. {path: corpora/mine-bpe} to compare tokenizers",
    )
    cell: ScalingCell | None = Field(None, exclude_if=lambda v: v is None)
    swept: SweptWidth | None = Field(None, exclude_if=lambda v: v is None)


class Objective(Strict):
    metric: str = Field("acc", min_length=1)
    direction: Literal["maximize", "minimize"] | None = None
    length: int | None = Field(None, ge=1, le=10**7, description="evaluation length (default: training length)")
    over: Literal["length", "grid", "longest"] = Field(
        "length", exclude_if=lambda v: v == "length",  # keeps old fingerprints
        description="length: the metric at objective.length; grid: its mean over every depth x "
                    "length cell of the evaluation; longest: the longest evaluation length at "
                    "which it holds >= threshold (harness.run.grid, docs/long_context.md)")
    threshold: float | None = Field(None, exclude_if=lambda v: v is None,
                                    description="over: longest: the value a length must hold")

    @property
    def name(self) -> str:
        """The metric the study ranks by: ``metric``, or its summary over the evaluation grid
        (``recall_grid``, ``recall_longest``), logged as ``val/<name>`` on each run."""
        return self.metric if self.over == "length" else summary_metric(self.metric, self.over)

    @property
    def words(self) -> str:
        """The objective in words (reports, descriptions)."""
        if self.over != "length":
            return grid_words(self.metric, self.over, self.threshold)
        return f"val/{self.metric}" + (f" at length {self.length}" if self.length else "")

    @property
    def downstream(self) -> bool:
        """An lm-eval metric (``eval/<task>/<metric>``, the study's ``downstream:`` tasks)."""
        return self.metric.startswith(DOWNSTREAM_PREFIX)

    @model_validator(mode="after")
    def _infer_direction(self) -> Objective:
        """The direction of a metric the harness knows; another metric's is asked for by
        :func:`harness.study.space.validate`, once it has said which metrics the task logs
        (a misspelt metric is then named as such, not asked a direction)."""
        if self.direction is None:
            base = self.metric.rsplit("/", 1)[-1] if self.downstream else self.metric
            if base in MINIMIZE:
                self.direction = "minimize"
            elif base in MAXIMIZE:
                self.direction = "maximize"
        return self

    @model_validator(mode="after")
    def _over(self) -> Objective:
        if self.over == "length":
            if self.threshold is not None:
                raise ValueError("threshold belongs to over: longest (the longest length held "
                                 "at or above it); remove it or set over: longest")
            return self
        if self.length is not None:
            raise ValueError(f"length: over: {self.over} summarises every evaluation length; "
                             f"remove objective.length")
        if self.downstream:
            raise ValueError(f"over: {self.over} summarises the task's own evaluation grid, "
                             f"not a downstream metric")
        if self.over == "longest":
            if self.threshold is None:
                raise ValueError("over: longest needs threshold (the value a length must hold, "
                                 "e.g. 0.9 for recall)")
            if self.direction == "minimize":
                raise ValueError(f"over: longest counts lengths held at or above threshold; "
                                 f"'{self.metric}' is minimised (rank by recall or acc)")
            top = SCALE_100.get(self.metric, 1.0 if self.metric in MAXIMIZE else math.inf)
            if not (math.isfinite(self.threshold) and 0 < self.threshold <= top):
                raise ValueError(f"threshold {self.threshold:g}: '{self.metric}' "
                                 + (f"runs from 0 to {top:g}, so a level above 0 and at most {top:g} "
                                    f"(e.g. {0.9 * top:g})" if math.isfinite(top) else "needs a finite level")
                                 + " decides which lengths are held; any other is held by every length or none")
        return self


def grid_words(metric: str, over: str, threshold: float | None) -> str:
    """An objective summarised over the evaluation grid, in words."""
    if over == "grid":
        return f"val/{metric}, mean over the depth x length grid"
    return f"the longest evaluation length holding val/{metric} >= {threshold:g}"


CostName = Literal["tokens_per_s", "peak_memory", "params", "state_size"]


class CostObjective(Strict):
    metric: CostName


class Budget(Strict):
    trials: int = Field(ge=1, le=100_000, description="tuning trials per candidate")
    steps: int | None = Field(None, ge=1, le=MAX_STEPS, description=(
        "optimizer steps of every run (or, with budget.seconds, the cap and the schedule's length)"))
    # compute budgets (harness.study.budget): each run's steps follow from its own cost
    flops: float | None = Field(None, gt=0, le=1e30, exclude_if=lambda v: v is None,
                                description="training FLOPs of every run (matrix products "
                                            "counted on one step; see docs/scaling.md)")
    tokens: int | None = Field(None, ge=1, le=10**16, exclude_if=lambda v: v is None,
                               description="training tokens of every run")
    count: Literal["matmul", "all"] = Field(
        "matmul", exclude_if=lambda v: v == "matmul",
        description="what budget.flops (and scaling.budgets in FLOPs) count: matrix products, or "
                    "also the element-wise and FFT work the counter misses (docs/scaling.md)")
    seconds: float | None = Field(None, gt=0, le=MAX_SECONDS, exclude_if=lambda v: v is None,
                                  description="wall clock of every run's training on the machine "
                                              "at hand (machine-dependent); needs steps as the cap")
    params: int | None = Field(None, ge=1, le=10**13,
                               description="match candidates' widths to this parameter count")
    state_size: int | None = Field(
        None, ge=1, le=10**13, exclude_if=lambda v: v is None,
        description="match candidates' widths to this decoding-state size (elements per sequence "
                    "at the training length, summed over layers), as Zoology and MAD do")
    time_per_run_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="wall-clock cap of every run")
    time_total_s: float | None = Field(None, gt=0, le=MAX_SECONDS,
                                       description="a worker starts no run after this")

    @field_validator("flops")
    @classmethod
    def _plausible_flops(cls, value: float | None) -> float | None:
        from harness.runtime.bounds import flops_problem

        if value is not None and (problem := flops_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_target(self) -> Budget:
        if self.params is not None and self.state_size is not None:
            raise ValueError("budget.params and budget.state_size both set a width: keep one")
        return self

    @model_validator(mode="after")
    def _one_length(self) -> Budget:
        given = [k for k in ("steps", "flops", "tokens") if getattr(self, k) is not None]
        if len(given) > 1 and not (self.seconds is not None and given == ["steps"]):
            raise ValueError(f"budget.{' and budget.'.join(given)} each set the length of a run: "
                             f"keep one")
        if self.seconds is not None and given != ["steps"]:
            raise ValueError("budget.seconds needs budget.steps (the cap, and the length the "
                             "learning-rate schedule is laid out over) and no flops or tokens")
        return self

    @property
    def currency(self) -> str:
        """What fixes a run's length: steps, flops, tokens or seconds."""
        return next((k for k in ("seconds", "flops", "tokens") if getattr(self, k) is not None), "steps")


class SamplerConfig(Strict):
    name: Literal["tpe", "random", "nsgaii", "grid"] = "tpe"  # grid: harness.study.grid
    seed: StudySeed | None = 0
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the sampler")

    @model_validator(mode="after")
    def _options(self) -> SamplerConfig:
        """The options must make a sampler (checked here, not in the first trial)."""
        if self.options and self.name == "grid":
            raise ValueError("options: sampler grid takes none (its points are the search lists)")
        if self.options:
            import optuna

            classes = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                       "nsgaii": optuna.samplers.NSGAIISampler}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _try_sampler(classes[self.name](**self.options), self.options)
            except Exception as exc:  # TypeError, ValueError, ... from the sampler's checks
                raise ValueError(f"options are not accepted by the {self.name} sampler: "
                                 f"{type(exc).__name__}: {exc}") from None
        return self


def _try_sampler(sampler: Any, options: dict[str, Any]) -> None:
    """Sample a few trials of a throw-away in-memory study with ``sampler``: an option of the
    wrong type (``n_startup_trials: x``) passes the constructor and fails only when the sampler
    first compares it, which must happen here rather than in every trial of the study."""
    import optuna

    startup = options.get("n_startup_trials", options.get("population_size", 10))
    trials = (startup if isinstance(startup, int) and 0 <= startup <= 60 else 10) + 2

    def objective(trial: Any) -> float:
        return trial.suggest_float("x", 0.0, 1.0) + trial.suggest_int("n", 1, 4)

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.CRITICAL)  # its failed trial is our error, not a log
    try:
        optuna.create_study(sampler=sampler).optimize(objective, n_trials=trials, catch=())
    finally:
        optuna.logging.set_verbosity(verbosity)


class PrunerConfig(Strict):
    name: Literal["none", "median", "hyperband", "successive_halving"] = "median"
    startup_trials: int = Field(2, ge=0, le=100_000,
                                description="median: trials completed before pruning starts")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="median: no pruning before this step")
    reduction_factor: int = Field(3, ge=2, le=100, description="hyperband, successive_halving")
    min_resource: int | None = Field(
        None, ge=1, le=MAX_STEPS, exclude_if=lambda v: v is None,
        description="hyperband, successive_halving: steps of the first rung (default: train.val_every)")


class ConfirmConfig(Strict):
    seeds: int = Field(3, ge=1, le=1000, description="fresh seeds per candidate's best configuration")
    baseline: str | None = Field(None, description="candidate the others are tested against")
    confidence: float = Field(0.95, gt=0, lt=1, description="intervals; the tests' level is 1 - confidence")
    # Both default to what studies did before they existed and are left out of the
    # fingerprint at that default, so existing studies resume.
    test: Literal["sign_flip", "t"] = Field(
        "sign_flip", exclude_if=lambda v: v == "sign_flip",
        description="paired test: exact sign-flip permutation test (no assumption; its smallest "
                    "p-value is 2/2^seeds) or paired t-test (assumes roughly normal differences)")
    vary_data: bool = Field(
        False, strict=True, exclude_if=lambda v: not v,
        description="each confirmation seed also draws a fresh data sample (train.data_seed = "
                    "data_seed + k for the k-th seed, the same k for every candidate)")


class ResumeConfig(Strict):
    heartbeat_s: int = Field(30, ge=1, le=3600, description="a running trial records a heartbeat this often")
    grace_s: int = Field(120, ge=1, le=7 * 86400,
                         description="a trial without heartbeat for this long is retried")
    max_retry: int = Field(2, ge=0, le=100, description="retries of an interrupted trial")
    poll_s: float = Field(2.0, gt=0, le=3600, description="how often an idle worker checks for work")

    @model_validator(mode="after")
    def _grace(self) -> ResumeConfig:
        if self.grace_s <= self.heartbeat_s:
            raise ValueError(f"grace_s ({self.grace_s}) must be longer than heartbeat_s "
                             f"({self.heartbeat_s}), or every running trial looks dead")
        return self


class ScalingTransfer(Strict):
    """How the learning rate carries across sizes (it moves the exponents: say which)."""

    rule: Literal["per_size", "scaled", "mup"] = Field(
        "per_size", description=(
            "per_size: every (size, budget) cell tuned with the study's search. scaled: one "
            "global lr per size, lr x (width / width_base)^-power, applied to every parameter "
            "(embeddings, norms' gains, biases and the readout included) of a model in the "
            "standard parametrization (its initialisation, its readout, its 1/sqrt(d) attention "
            "scores): not muP, whatever the power. mup: every cell's model in muP "
            "(model.parametrization: mup with this base shape: per-parameter learning rates, "
            "initialisation and multipliers by role, 1/d attention), so one set of "
            "hyper-parameters holds at every size: lr fixed when given, else searched per cell"))
    lr: float | None = Field(None, gt=0, le=100, description=(
        "scaled: the lr tuned at the base width; mup: the lr of every cell (tuned at the base "
        "shape), or unset to search it per cell"))
    width: int | None = Field(None, ge=1, description="scaled: the base width (the smallest size's)")
    power: float = Field(1.0, ge=0, le=4, description=(
        "scaled: the exponent of the global lr's width scaling (1: lr / width, which muP "
        "prescribes for Adam's hidden matrices only; 0: the same lr at every size)"))
    width_param: str = Field("d_model", min_length=1, description="scaled: the model parameter that is the width")
    base: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, exclude_if=lambda b: not b,
        description="mup: the base shape, the model params that grow with width at their base values "
                    "({d_model: 64}): where muP equals the standard parametrization")

    @model_validator(mode="after")
    def _scaled(self) -> ScalingTransfer:
        if self.rule == "scaled" and (self.lr is None or self.width is None):
            raise ValueError("rule 'scaled' needs lr (tuned at the base width) and width")
        if self.rule == "mup" and not self.base:
            raise ValueError("rule 'mup' needs base, the model params that grow with width at their "
                             "base values, e.g. base: {d_model: 64}")
        if self.rule != "mup" and self.base:
            raise ValueError(f"base is the base shape of rule 'mup'; rule '{self.rule}' does not use it")
        return self


class Transfer(Strict):
    """An ordinary study that tunes small: every candidate's trials run at ``base`` (its model's
    params there) in muP, and its confirmation at the candidate's own width with the tuned
    hyper-parameters unchanged (muP's transfer); the report says so."""

    rule: Literal["mup"] = Field("mup", description="mup: tune at the base shape in muP, confirm at full width")
    base: dict[str, Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="the model params that grow with width at the values the trials "
                                  "run at, e.g. {d_model: 64} (each candidate uses the ones its model has)")


class ScalingConfig(Strict):
    """A scaling study: candidates x sizes x compute budgets (harness.study.budget)."""

    sizes: list[dict[str, Any]] = Field(
        min_length=3, description="model params of each size, merged into every candidate's "
                                  "(a width/depth schedule); at least 3 for an iso-FLOP parabola")
    budgets: list[Annotated[float, Field(gt=0, le=1e30)]] = Field(
        min_length=3, description="training compute of each run; at least 3 spanning >= 10x")
    unit: Literal["flops", "tokens"] = "flops"
    transfer: ScalingTransfer = Field(default_factory=ScalingTransfer)
    bootstrap: int | None = Field(None, ge=20, le=100_000, exclude_if=lambda v: v is None, description=(
        "bootstrap replicates behind the report's intervals (default: the report's, 400); fewer "
        "give a quicker report with coarser intervals"))

    @model_validator(mode="after")
    def _grid(self) -> ScalingConfig:
        from harness.study.budget import check_budgets

        check_budgets(list(self.budgets))
        if self.unit == "flops":
            from harness.runtime.bounds import flops_problem

            for b in self.budgets:
                if (problem := flops_problem(b)) is not None:
                    raise ValueError(f"budgets: {problem}")
        if any(not s for s in self.sizes):
            raise ValueError("sizes: every size must set at least one model parameter")
        keys = [json.dumps(s, sort_keys=True) for s in self.sizes]
        if len(set(keys)) < len(keys):
            raise ValueError("sizes: two sizes are the same")
        return self


class StudyTracking(Strict):
    experiment: ExperimentName | None = None  # default: the study name


class ReferenceRow(Strict):
    model: str = Field(min_length=1, description="the published model's name")
    value: float | None = Field(None, description="the published number; null where the paper has none")
    candidate: str | None = Field(None, description="this study's candidate closest to it, if any")
    note: str = ""


class Reference(Strict):
    """Published numbers the report shows beside the measured ones (data, never a verdict)."""

    source: str = Field(min_length=1, description="paper, table, arXiv id")
    metric: str = Field(min_length=1, description="what the numbers are, e.g. 'test accuracy (%)'")
    scale: float = Field(100.0, gt=0, description="ours x scale is on the published scale (accuracy 0-1 vs %)")
    rows: list[ReferenceRow] = Field(min_length=1)
    differences: list[str] = Field(default_factory=list, description="protocol differences, stated")


class Downstream(Strict):
    """lm-eval tasks run on each confirmation run after it trains (docs/evaluation.md): their
    metrics land on the run as ``eval/<task>/<metric>`` and in the report's downstream table."""

    tasks: list[str] = Field(min_length=1, description="lm-eval task names")
    include_path: str | None = Field(None, description="a folder of task YAMLs (local data files)")
    limit: float | None = Field(None, gt=0, description="documents per task (below 1: a share)")
    num_fewshot: int | None = Field(None, ge=0)
    batch_size: int | None = Field(None, ge=1)


class StudyConfig(Strict):
    kind: Literal["study"] = "study"
    profile: str | None = Field(None, exclude_if=lambda v: v is None,
                                description="the profile of the study file it was loaded with")
    name: Name | None = None
    description: str = ""
    task: ComponentConfig
    candidates: list[Candidate] = Field(min_length=1)
    objective: Objective = Field(default_factory=Objective)
    cost: CostObjective | None = None
    #: the cost on the report's quality-versus-cost front (default: the cost objective, else
    #: the matched budget: state_size or params)
    front: CostName | None = Field(None, exclude_if=lambda v: v is None)
    train: dict[str, Any] = Field(default_factory=dict, description="fixed training settings")
    search: dict[str, Any] = Field(default_factory=dict, description="shared training ranges")
    budget: Budget
    scaling: ScalingConfig | None = Field(None, exclude_if=lambda v: v is None)
    sweep: Sweep | None = Field(None, exclude_if=lambda v: v is None,
                                description="every candidate at each width (recall against state)")
    #: tune every candidate at a small width and confirm at its own (harness.study.transfer)
    transfer: Transfer | None = Field(None, exclude_if=lambda v: v is None)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    pruner: PrunerConfig = Field(default_factory=PrunerConfig)
    confirm: ConfirmConfig = Field(default_factory=ConfirmConfig)
    resume: ResumeConfig = Field(default_factory=ResumeConfig)
    tracking: StudyTracking = Field(default_factory=StudyTracking)
    seed: StudySeed = Field(0, description="training seed of every tuning trial")
    data_seed: Seed = Field(0, description="task data (the same for every run)")
    plugins: list[str] = Field(default_factory=list, description="local plugin .py files")
    reference: Reference | None = Field(None, exclude_if=lambda v: v is None,
                                        description="published numbers shown beside the report's")
    downstream: Downstream | None = Field(None, exclude_if=lambda v: v is None,
                                          description="lm-eval tasks after each confirmation run")

    @model_validator(mode="before")
    @classmethod
    def _expand_scaling(cls, data: Any) -> Any:
        """A scaling study's candidates crossed with its sizes and budgets (once: a stored
        record's candidates already carry their cells)."""
        from harness.study import recall
        from harness.study.budget import expand

        return recall.expand(expand(data)) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _sweep(self) -> StudyConfig:
        if self.sweep is None:
            if any(c.swept is not None for c in self.candidates):
                raise ValueError("candidates: a swept width belongs to a sweep study; add sweep: "
                                 "or remove the candidates' swept")
            return self
        if self.scaling is not None:
            raise ValueError("sweep: a scaling study sets its sizes in scaling.sizes; keep one")
        if self.width_target is not None:
            raise ValueError(f"sweep: budget.{self.width_target[0]} matches every candidate to one "
                             f"width, the sweep runs each at several; keep one")
        return self

    @model_validator(mode="after")
    def _transfer(self) -> StudyConfig:
        from harness.study.transfer import check_transfer

        check_transfer(self)
        return self

    @model_validator(mode="after")
    def _scaling_protocol(self) -> StudyConfig:
        if self.scaling is None:
            if any(c.cell is not None for c in self.candidates):
                raise ValueError("candidates: a cell belongs to a scaling study; add scaling: or "
                                 "remove the candidates' cell")
            if self.budget.steps is None and self.budget.currency == "steps":
                raise ValueError("budget: give the length of every run: steps, flops, tokens, "
                                 "or seconds with steps")
            return self
        if self.budget.currency != "steps" or self.budget.steps is not None:
            raise ValueError("budget.steps/flops/tokens/seconds: a scaling study's runs get their "
                             "compute from scaling.budgets; remove them from budget")
        if self.objective.direction != "minimize":
            raise ValueError(f"objective: a scaling law is fitted to a loss that falls with "
                             f"compute; '{self.objective.metric}' is maximised (use loss, bpc "
                             f"or ppl)")
        from harness.runtime.bounds import grid_problem

        bases = len({c.cell.base for c in self.candidates if c.cell is not None})
        parts = f"{bases} candidate(s) x {len(self.scaling.sizes)} sizes x {len(self.scaling.budgets)} budgets"
        if (problem := grid_problem(len(self.candidates), parts, self.budget.trials)) is not None:
            raise ValueError(f"scaling: {problem}")
        t = self.scaling.transfer
        if (t.rule == "scaled" or (t.rule == "mup" and t.lr is not None)) and "lr" in self.search:
            raise ValueError(f"search.lr: the transfer rule '{t.rule}' with scaling.transfer.lr fixes "
                             f"the learning rate of every size; remove lr from search (or the "
                             f"rule's lr)")
        return self

    @model_validator(mode="after")
    def _names(self) -> StudyConfig:
        names = [c.name for c in self.candidates]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"candidate names must be unique; repeated: {', '.join(dup)}")
        unknown = sorted({r.candidate for r in self.reference.rows if r.candidate} - set(names)
                         if self.reference else set())
        if unknown:
            raise ValueError(f"reference.rows name candidates this study lacks: {', '.join(unknown)}")
        if self.objective.downstream:
            task = self.objective.metric.split("/")[1] if self.objective.metric.count("/") >= 2 else ""
            if self.downstream is None or task not in self.downstream.tasks:
                raise ValueError(
                    f"objective.metric '{self.objective.metric}' is a downstream metric "
                    f"(eval/<task>/<metric>): list its task '{task}' under downstream.tasks "
                    f"(docs/evaluation.md)")
        if self.confirm.baseline is not None and self.confirm.baseline not in names:
            raise ValueError(
                f"confirm.baseline '{self.confirm.baseline}' is not a candidate "
                f"(candidates: {', '.join(names)})"
            )
        return self

    @property
    def width_target(self) -> tuple[str, int] | None:
        """What candidates' widths are matched on (``params`` or ``state_size``) and the target."""
        if self.budget.params is not None:
            return "params", self.budget.params
        if self.budget.state_size is not None:
            return "state_size", self.budget.state_size
        return None

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

    def confirm_data_seed(self, seed: int) -> int:
        """The task data seed of the confirmation run with training seed ``seed``: the
        study's ``data_seed``, or with ``confirm.vary_data`` a fresh one per seed (the k-th
        confirmation seed gets ``data_seed + k``, for every candidate alike)."""
        return self.data_seed + (seed - self.seed) if self.confirm.vary_data else self.data_seed

    def protocol_dict(self) -> dict[str, Any]:
        """What a resumed study must not change (everything but runtime settings)."""
        return self.model_dump(mode="json", exclude={"resume": True, "plugins": True, "reference": True,
                                                     "budget": {"time_total_s"}})

    def fingerprint(self) -> str:
        text = json.dumps(self.protocol_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- loading -----------------------------------------------------------------------------
def parse_study_config(data: Mapping[str, Any], source: str = "study") -> StudyConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"invalid study in {source}: a mapping is needed, not {type(data).__name__}.")
    try:
        return StudyConfig.model_validate(dict(data))
    except ValidationError as exc:
        text = format_validation_error(exc, source, StudyConfig, "studies/quickstart.yaml")
        raise ConfigError(text.replace("invalid config in", "invalid study in", 1)) from None


def load_study_config(path: str | Path, name: str | None = None, profile: str | None = None,
                      overrides: list[str] | None = None) -> StudyConfig:
    """Read a study YAML with one of its profiles (:mod:`harness.study.profiles`) and then
    ``key=value`` overrides (as ``--set`` gives them); the study's name defaults to the
    file's stem, suffixed with the profile."""
    from harness.study import profiles

    data = read_yaml(path)
    if data.get("kind", "study") != "study":
        raise ConfigError(f"{path} is a '{data.get('kind')}' config, not a study; pass a study YAML.")
    data, chosen = profiles.apply(data, profile, str(path))
    data = apply_overrides(data, list(overrides or []))
    if "plugins" in data and data["plugins"] is None:
        raise ConfigError(f"{path}: plugins is null (an empty key); list the local plugin .py files "
                          f"under it, or remove the key.")
    plugins = data.get("plugins") or []
    if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins):
        base = Path(path).resolve().parent
        data["plugins"] = [str((base / p).resolve()) for p in plugins]
    _absolute_data_paths(data)
    if name is not None:
        data["name"] = name
    else:
        import re

        stem = data.get("name") or Path(path).stem
        if "name" not in data and not re.match(NAME_PATTERN, stem):
            raise ConfigError(f"{path}: the study is named after its file, and '{stem}' is not a "
                              f"valid name (letters, digits, '_', '.', '-'); add name: to the file "
                              f"or pass --study-name.")
        data["name"] = f"{stem}-{chosen}" if chosen else stem
    data["profile"] = chosen
    return parse_study_config(data, str(path))


#: endings of a task param that names a file even without a folder in it
_DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".parquet", ".txt", ".bz2", ".gz", ".xz")


def _absolute_data_paths(data: dict[str, Any]) -> None:
    """Task params that name files or folders relative to the working folder
    (``path: corpora/mine``, ``train: data/*.jsonl``) made absolute when the study is
    created: the record, the workers and the report then name the same data wherever a
    command runs from. A param counts as a path when it has a folder in it or a data file's
    ending, and it (or its glob, or its parent folder: a corpus prepared on first use)
    exists; names such as ``shakespeare`` or ``bpe:1024`` are left as they are."""
    import glob
    import os

    def fix(params: Any) -> None:
        if not isinstance(params, dict):
            return
        for key, value in params.items():
            if not isinstance(value, str) or not value or "\n" in value:
                continue
            p = Path(value)
            if p.is_absolute() or value.startswith("~") or not (
                    "/" in value or value.endswith(_DATA_SUFFIXES)):
                continue
            if p.exists() or glob.glob(value) or (p.parent != Path(".") and p.parent.is_dir()):
                params[key] = os.path.abspath(value)

    task = data.get("task")
    if isinstance(task, dict):
        fix(task.get("params"))
    for cand in data.get("candidates") or []:
        if isinstance(cand, dict) and isinstance(cand.get("task"), dict):
            fix(cand["task"])


def protocol_params(config: StudyConfig) -> dict[str, Any]:
    """The parent run's params: the protocol, with candidates keyed by name."""
    proto = config.protocol_dict()
    candidates = proto.pop("candidates")
    proto["confirm"]["seed_list"] = config.confirm_seeds()
    proto["confirm"]["baseline"] = config.baseline  # the first candidate unless named
    proto["candidate"] = {c.pop("name"): c for c in candidates}
    return proto
