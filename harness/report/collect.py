"""The report's numbers, read back from the two stores: Optuna (slots, values, best
configurations) and MLflow (each run's metrics and tags).

Owns :class:`CandidateResult` (one candidate's tuning summary, best configuration,
confirmation seeds) and the statistics over them: mean and bootstrap interval over the
confirmation seeds, ranks, the paired test against the baseline, cost means, the
evaluation-length table's values and the quality-versus-cost front. Draws and writes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from harness import stats
from harness.keys import Attr, Phase, Tag, val_key
from harness.study.progress import best_trial, phase_progress
from harness.study.schema import COSTS
from harness.study.storage import StudyHandle

N_RESAMPLES = 10_000


@dataclass
class SeedRun:
    seed: int
    run_id: str
    value: float
    metrics: dict[str, float]
    not_applicable: list[int]


@dataclass
class CandidateResult:
    name: str
    label: str
    seeds: list[SeedRun]
    tuning: dict[str, int]
    best_trial: int | None
    best_value: float | None
    best_config: dict[str, Any] | None
    tuning_points: list[tuple[float, float]] = field(default_factory=list)  # (cost, quality)
    mean: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    rank: float = math.nan
    paired: stats.PairedComparison | None = None
    cost: dict[str, float] = field(default_factory=dict)  # mean over seeds
    by_length: dict[int, float | None] = field(default_factory=dict)  # None: n/a
    on_front: bool = False

    @property
    def values(self) -> dict[int, float]:
        return {s.seed: s.value for s in self.seeds}

    @property
    def uses_attention(self) -> bool:
        return bool(self.best_config and (self.best_config.get("model") or {}).get("attention"))


# -- collecting -------------------------------------------------------------------------------
def _children(handle: StudyHandle) -> dict[str, Any]:
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


def _cost_value(metrics: dict[str, float], cost: str) -> float:
    keys = COSTS[cost][0]
    return next((float(metrics[k]) for k in keys if k in metrics), math.nan)


def front_cost(handle: StudyHandle) -> str:
    """The cost on the front's x axis: the study's cost objective, else parameters."""
    return handle.config.cost.metric if handle.config.cost else "params"


def collect(handle: StudyHandle, lengths: tuple[int, ...]) -> list[CandidateResult]:
    """Per candidate: tuning summary, best configuration, confirmation runs and statistics."""
    from optuna.trial import TrialState

    cfg = handle.config
    children = _children(handle)
    metric, cost = cfg.objective.metric, front_cost(handle)
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
                points.append((_cost_value(run.data.metrics, cost), t.values[0]))
        confirm = handle.load(Phase.CONFIRM, cand.name)
        seeds = []
        for t in confirm.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            run = children.get(f"{confirm.study_name}#{t.number}")
            if run is None:
                continue
            na = run.data.tags.get(Tag.NOT_APPLICABLE, "")
            seeds.append(SeedRun(int(t.user_attrs[Attr.SEED]), run.info.run_id, t.values[0],
                                 dict(run.data.metrics), [int(x) for x in na.split(",") if x]))
        seeds.sort(key=lambda s: s.seed)
        best_config = best.user_attrs.get(Attr.CONFIG) if best is not None else None
        label = " · ".join(x for x in (cand.model.name,
                                       cand.model.attention.name if cand.model.attention else "",
                                       cand.model.position.name if cand.model.position else "") if x)
        res = CandidateResult(
            cand.name, label, seeds,
            {"complete": prog.complete, "pruned": prog.pruned, "failed": prog.failed,
             "interrupted": prog.retried, "budget": prog.slots},
            best.number if best else None, best.values[0] if best else None, best_config, points)
        values = [s.value for s in seeds]
        res.mean = stats.mean(values)
        res.ci = stats.bootstrap_ci(values, cfg.confirm.confidence, N_RESAMPLES)
        for name in COSTS:
            res.cost[name] = stats.mean([_cost_value(s.metrics, name) for s in seeds])
        for length in lengths:
            if seeds and all(length in s.not_applicable for s in seeds):
                res.by_length[length] = None
            else:
                res.by_length[length] = stats.mean(
                    [s.metrics.get(val_key(metric, length), math.nan) for s in seeds])
        results.append(res)
    _compare(results, handle)
    return results


def _compare(results: list[CandidateResult], handle: StudyHandle) -> None:
    cfg = handle.config
    maximize = cfg.objective.direction == "maximize"
    for res, rank in zip(results, stats.ranks([r.mean for r in results], maximize), strict=True):
        res.rank = rank
    base = next(r for r in results if r.name == cfg.baseline)
    for res in results:
        if res is not base:
            res.paired = stats.paired_comparison(res.values, base.values, cfg.confirm.confidence,
                                                 N_RESAMPLES)
    cost = front_cost(handle)
    points = [(r.mean, r.cost.get(cost, math.nan)) for r in results]
    mask = stats.pareto_mask(points, [maximize, COSTS[cost][1] == "maximize"])
    for res, on in zip(results, mask, strict=True):
        res.on_front = on
