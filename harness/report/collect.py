"""The report's numbers, read back from the two stores: Optuna (slots, values, best
configurations) and MLflow (each run's metrics, tags and resolved configuration).

Owns :class:`SeedRun` (one confirmation run), :class:`CandidateResult` (one candidate: its
tuning summary, best configuration, confirmation seeds and, once :mod:`.verdict` has
analysed them, their statistics) and :class:`Protocol` (what the tables need to know about
the study). Computes nothing and draws nothing: a report can be rendered from a list of
``CandidateResult`` built by hand (the golden-file tests do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from harness.keys import Attr, Phase, Tag
from harness.report import stats
from harness.study.progress import best_trial, phase_progress
from harness.study.rungs import rungs_in_words
from harness.study.schema import COSTS, grid_words
from harness.study.storage import StudyHandle


@dataclass
class SeedRun:
    seed: int
    run_id: str
    value: float
    metrics: dict[str, float]
    not_applicable: list[int] = field(default_factory=list)
    kernel: str = ""  # the run's harness.kernel tag: fla, reference, pytorch ("": not recorded)


@dataclass(frozen=True)
class Comparison:
    """A candidate against another (the best, or the baseline) on matched seeds."""

    against: str
    paired: stats.PairedComparison  # candidate minus the other; p_adjusted over all pairs
    improvement: float  # P(candidate better than the other), seed against seed
    improvement_interval: stats.Interval
    seeds_needed: float  # about how many seeds would resolve it (inf: never; NaN: unknown)


@dataclass
class CandidateResult:
    name: str
    label: str
    seeds: list[SeedRun]
    tuning: dict[str, int]
    best_trial: int | None = None
    best_value: float | None = None
    best_config: dict[str, Any] | None = None
    tuning_points: list[tuple[float, float]] = field(default_factory=list)  # (cost, quality)
    #: the resolved configuration of its confirmation runs, flattened (``model.params.layers``)
    config: dict[str, str] = field(default_factory=dict)
    #: keys of ``config`` the tuning searched, and those parameter matching set
    searched: list[str] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)
    #: searched values of the best trial in the outer tenth of their range (:func:`range_edges`)
    edges: list[str] = field(default_factory=list)
    #: confirmation seeds whose run FAILED (diverged, crashed), with the reason
    failed_seeds: dict[int, str] = field(default_factory=dict)
    #: what its confirmation runs read (tag ``harness.data``; empty: generated data) and the
    #: task params that line replaces
    data: str = ""
    data_params: tuple[str, ...] = ()
    # -- filled by verdict.analyze ------------------------------------------------------------
    mean: float = math.nan
    interval: stats.Interval | None = None
    rank: int | None = None  # 1 + the number of candidates resolved better; None: no value
    best_group: bool = False
    vs_best: Comparison | None = None
    vs_baseline: Comparison | None = None
    cost: dict[str, float] = field(default_factory=dict)  # mean over seeds
    by_length: dict[int, float | None] = field(default_factory=dict)  # None: n/a
    by_length_interval: dict[int, stats.Interval] = field(default_factory=dict)
    on_front: bool = False
    params_off: float | None = None  # relative deviation from budget.params

    def values(self) -> dict[int, float]:
        return {s.seed: s.value for s in self.seeds}

    @property
    def implementation(self) -> str:
        """What computed its mixer in the confirmation runs, in words (the cost table's
        column): its speed is an implementation's, not only an architecture's."""
        return implementation_words(sorted({s.kernel for s in self.seeds if s.kernel}))

    @property
    def uses_attention(self) -> bool:
        return bool(self.best_config and (self.best_config.get("model") or {}).get("attention"))


@dataclass(frozen=True)
class Protocol:
    """What the report's tables and verdict need to know about the study."""

    study: str
    metric: str
    maximize: bool
    length: int  # the objective's evaluation length
    train_length: int
    lengths: tuple[int, ...]
    baseline: str
    confidence: float
    test: str = "sign_flip"
    seeds: tuple[int, ...] = ()  # the confirmation seeds planned
    param_target: int | None = None
    front_cost: str = "params"
    vary_data: bool = False
    complete: bool = True
    task: str = ""  # the task, as the protocol paragraph names it
    tuning: str = ""  # how every candidate was tuned, in words
    description: str = ""
    untuned: bool = False  # one trial per candidate: a shared recipe, not tuned
    data: str = ""  # what the runs read, from their manifest (:func:`with_data`); empty: generated
    scaling: bool = False  # a scaling or sweep study: its candidates differ in size by design
    #: what the objective summarises (``objective.over``): length, grid or longest
    over: str = "length"
    threshold: float | None = None
    transfer: str = ""  # tuned at another width (harness.study.transfer), in words; empty: not

    @property
    def alpha(self) -> float:
        return round(1 - self.confidence, 12)

    @property
    def objective(self) -> str:
        if self.over != "length":
            return grid_words(self.metric, self.over, self.threshold)
        return f"val/{self.metric} @{self.length}"


#: what the protocol paragraph says of a task's documents (the study record's ``documents``)
DOCUMENTS = {"packed": " (documents packed: a window spans <eod>, its tokens see the previous document)",
             "separate": " (documents kept apart: no token sees another document)"}


def protocol(handle: StudyHandle, complete: bool = True) -> Protocol:
    cfg = handle.config
    b = cfg.budget
    match = f", widths matched to {b.params:,} parameters" if b.params else ""
    from harness.study.transfer import protocol_text as transfer_text

    transfer = transfer_text(cfg)
    return Protocol(
        study=handle.name, metric=cfg.objective.metric,
        maximize=cfg.objective.direction == "maximize",
        length=cfg.objective.length or int(handle.record["train_length"]),
        train_length=int(handle.record["train_length"]),
        lengths=tuple(int(n) for n in handle.record["eval_lengths"]),
        baseline=cfg.baseline, confidence=cfg.confirm.confidence, test=cfg.confirm.test,
        seeds=tuple(cfg.confirm_seeds()), param_target=cfg.budget.params,
        front_cost=front_cost(handle), vary_data=cfg.confirm.vary_data, complete=complete,
        task=f"{cfg.task.name} {cfg.task.params}" + DOCUMENTS.get(str(handle.record.get("documents")), ""),
        tuning=(f"every candidate tuned with {b.trials} trials of {run_length(cfg)} "
                f"({cfg.sampler.name} sampler, {rungs_in_words(cfg)}{match})"
                + (f", {transfer}" if transfer else "")),
        transfer=transfer,
        description=cfg.description.strip(), untuned=b.trials < 2, scaling=cfg.scaling is not None or cfg.sweep is not None,
        over=cfg.objective.over, threshold=cfg.objective.threshold)


def with_data(proto: Protocol, results: list[CandidateResult], cfg: Any) -> Protocol:
    """The protocol naming the data the runs read (a prepared corpus's manifest, recorded by
    each run as ``harness.data``) in place of the task params that only say where to look
    (``path``, ``source``, ``tokenizer``: a default source the path overrides is not what was
    read). Candidates that read different data are named each with theirs."""
    read = {r.name: r.data for r in results if r.data}
    if not read:
        return proto
    dropped = {k for r in results for k in r.data_params}
    params = {k: v for k, v in cfg.task.params.items() if k not in dropped}
    if len(set(read.values())) == 1:
        data = next(iter(read.values()))
    else:
        data = "; ".join(f"{name}: {text}" for name, text in read.items())
    return replace(proto, task=f"{cfg.task.name} {params}; data read: {data}", data=data)


def run_length(cfg: Any) -> str:
    """What fixes each run's length, in words (``400 steps``, ``1e+13 training FLOPs``)."""
    b = cfg.budget
    if cfg.scaling is not None:
        return (f"the training {cfg.scaling.unit} of their scaling cell "
                f"({', '.join(f'{x:.3g}' for x in cfg.scaling.budgets)})")
    if b.currency == "flops":
        return f"{b.flops:.3g} training FLOPs each (steps from each candidate's FLOPs per token)"
    if b.currency == "tokens":
        return f"{b.tokens:,} training tokens each"
    if b.currency == "seconds":
        return f"{b.seconds:g} s of wall clock each (machine-dependent; at most {b.steps} steps)"
    return f"{b.steps} steps"


def cost_value(metrics: dict[str, float], cost: str) -> float:
    keys = COSTS[cost][0]
    return next((float(metrics[k]) for k in keys if k in metrics), math.nan)


def front_cost(handle: StudyHandle) -> str:
    """The cost on the front's x axis: the study's ``front``, else its cost objective, else the
    budget it matches (decoding-state size or parameters)."""
    cfg = handle.config
    if cfg.front:
        return cfg.front
    if cfg.cost:
        return cfg.cost.metric
    return "state_size" if cfg.budget.state_size else "params"


# -- collecting -------------------------------------------------------------------------------
def child_runs(handle: StudyHandle) -> dict[str, Any]:
    """Child runs of the study by their ``harness.trial`` tag (one query, paged)."""
    client = handle.tracker.client
    out, token = {}, None
    while True:
        page = client.search_runs([handle.experiment_id()],
                                  f"tags.`{Tag.PARENT_RUN}` = '{handle.parent_run_id}'",
                                  max_results=1000, page_token=token)
        for run in page:
            out[run.data.tags.get(Tag.TRIAL, run.info.run_id)] = run
        token = page.token
        if not token:
            return out


def config_key(optuna_param: str) -> str:
    """The flattened config key of a searched Optuna parameter (``attention.dropout`` ->
    ``model.attention.params.dropout``, ``mup.output_mult`` -> ``model.mup.output_mult``)."""
    role, _, name = optuna_param.partition(".")
    if role == "model":
        return f"model.params.{name}"
    if role == "train":
        return f"train.{name}"
    if role == "mup":  # μP's base-width multipliers (study search mup.FIELD)
        return f"model.mup.{name}"
    return f"model.{role}.params.{name}"


def _width_params(handle: StudyHandle) -> dict[str, str]:
    """Per candidate, the config key parameter matching sets (only with budget.params)."""
    cfg = handle.config
    if cfg.budget.params is None:
        return {}
    from harness.study.space import load_registry

    registry = load_registry(cfg)
    out = {}
    for cand in cfg.candidates:
        width = registry.get("model", cand.model.name).width_param
        if width:
            out[cand.name] = f"model.params.{width}"
    return out


def collect(handle: StudyHandle) -> list[CandidateResult]:
    """Per candidate: tuning summary, best configuration and its confirmation runs."""
    from optuna.trial import TrialState

    cfg = handle.config
    children = child_runs(handle)
    cost = front_cost(handle)
    widths = _width_params(handle)
    results = []
    for cand in cfg.candidates:
        tune = handle.load(Phase.TUNE, cand.name)
        trials = tune.get_trials(deepcopy=False)
        prog = phase_progress(trials, cfg.budget.trials)
        best = best_trial(tune, cfg)
        points = []
        for t in trials:
            run = children.get(f"{tune.study_name}#{t.number}")
            if t.state == TrialState.COMPLETE and run is not None:
                points.append((cost_value(run.data.metrics, cost), t.values[0]))
        confirm = handle.load(Phase.CONFIRM, cand.name)
        seeds: list[SeedRun] = []
        config: dict[str, str] = {}
        data, data_params = "", ()
        for t in confirm.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            run = children.get(f"{confirm.study_name}#{t.number}")
            if run is None:
                continue
            na = run.data.tags.get(Tag.NOT_APPLICABLE, "")
            seeds.append(SeedRun(int(t.user_attrs[Attr.SEED]), run.info.run_id, t.values[0],
                                 dict(run.data.metrics), [int(x) for x in na.split(",") if x],
                                 run.data.tags.get(Tag.KERNEL, "")))
            config = config or dict(run.data.params)
            data = data or run.data.tags.get(Tag.DATA, "")
            data_params = data_params or tuple(
                k for k in run.data.tags.get(Tag.DATA_PARAMS, "").split(",") if k)
        seeds.sort(key=lambda s: s.seed)
        failed = {int(t.user_attrs[Attr.SEED]): str(t.user_attrs.get(Attr.FAILURE, "failed"))
                  for t in confirm.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                  if Attr.SEED in t.user_attrs}
        label = " · ".join(c.name for c in (cand.model, cand.model.attention, cand.model.mixer,
                                            cand.model.position) if c is not None)
        results.append(CandidateResult(
            cand.name, label, seeds,
            {"complete": prog.complete, "pruned": prog.pruned, "failed": prog.failed,
             "interrupted": prog.retried, "budget": prog.slots},
            best.number if best else None, best.values[0] if best else None,
            best.user_attrs.get(Attr.CONFIG) if best is not None else None, points,
            config=config,
            searched=sorted(config_key(k) for k in (best.params if best is not None else {})),
            matched=[widths[cand.name]] if cand.name in widths else [],
            edges=range_edges(best, skip=widths.get(cand.name)) if best is not None else [],
            failed_seeds=dict(sorted(failed.items())), data=data, data_params=data_params))
    return results


#: a tuned value this close to an end of its range (share of the range, log scale where the
#: range is) may have an optimum outside it
EDGE = 0.1


def range_edges(trial: Any, skip: str | None = None) -> list[str]:
    """The best trial's numeric values in the outer tenth of their searched range (``lr
    0.0175 in the top tenth of [0.002, 0.02], log scale``): the search may have cut the
    candidate's optimum off. Widths set by parameter matching (``skip``) are not tuned."""
    from optuna.distributions import FloatDistribution, IntDistribution

    out = []
    for key, dist in sorted(trial.distributions.items()):
        value = trial.params.get(key)
        if not isinstance(dist, FloatDistribution | IntDistribution) or dist.high <= dist.low \
                or value is None or config_key(key) == skip:
            continue
        lo, hi, v = float(dist.low), float(dist.high), float(value)
        if dist.log:
            lo, hi, v = math.log(lo), math.log(hi), math.log(v)
        share = (v - lo) / (hi - lo)
        if share < EDGE or share > 1 - EDGE:
            side = "bottom" if share < EDGE else "top"
            out.append(f"{config_key(key)} {value:.3g} in the {side} tenth of [{dist.low:.3g}, "
                       f"{dist.high:.3g}]{', log scale' if dist.log else ''}")
    return out


#: the cost tables' words for each ``harness.kernel`` tag (harness.nn.fast_path)
IMPLEMENTATIONS = {"fla": "FLA kernel", "reference": "reference implementation", "pytorch": "PyTorch"}


def implementation_words(kernels: list[str]) -> str:
    """``FLA kernel``, ``reference implementation``, ``PyTorch`` (attention), several joined
    by ' + ' when seeds differ; '–' for runs that recorded none."""
    return " + ".join(IMPLEMENTATIONS.get(k, k) for k in kernels) or "–"
