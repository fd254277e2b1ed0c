"""The study's parent MLflow run (its protocol params) and the views of the runs table that
``harness ui`` links to (:func:`study_views`).

Params (logged when the study is created, :func:`protocol_params`): the protocol (objective,
budget with its parameter target, confirmation seeds, sampler, pruner, task) and each
candidate's definition under ``candidate.<name>.*``, as values (JSON), never Python reprs.
The summary metrics and the description, which need the report's numbers, are written by
:mod:`harness.report.summary`.
"""

from __future__ import annotations

from typing import Any

from harness.keys import Phase, Tag, curve_key, val_key
from harness.study.schema import StudyConfig
from harness.study.storage import StudyHandle

NOTE_TAG = Tag.NOTE


# -- the runs table's views ----------------------------------------------------------------------
VIEW_TAG = "mlflow.sharedViewState."  # + key: a view of the runs table the UI opens by link
TUNING = "tuning"  # the second view's suffix: the tuning trials


def view_key(study: str, which: str = "") -> str:
    """``harness-<study>`` (the confirmation runs) or ``harness-<study>-tuning``."""
    return f"harness-{study}" + (f"-{which}" if which else "")


def study_views(name: str, config: StudyConfig, record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The study's views of the runs table (MLflow's shared view state; the link is
    ``...runs?viewStateShareKey=KEY``), by key.

    ``harness-<study>``: the confirmation runs only (a filter on ``harness.phase``), grouped
    by candidate, so a group row's average is the candidate's confirmed mean, the report's
    number (tuning and pruned trials would pull it down); groups ordered by the objective,
    best first; the objective at the objective's length as the first column, then the other
    evaluation lengths, the seed and the searched parameters. Its charts open on what
    compares candidates: the objective per candidate (bars of the group means), the metric
    against evaluation length (one line per candidate: the cross-run length curve) and the
    learning curves; the cost charts come last, collapsed.

    ``harness-<study>-tuning``: the tuning trials, grouped by candidate with the best trial's
    value (max or min by the objective's direction) as the group's."""
    metric = config.objective.metric
    lengths = [int(n) for n in record["eval_lengths"]]
    length = config.objective.length or int(record["train_length"])
    objective = val_key(metric, length) if config.objective.over == "length" else val_key(config.objective.name)
    maximize = config.objective.direction == "maximize"
    lengths_columns = [f"metrics.`{objective}`"]
    lengths_columns += [f"metrics.`{val_key(metric, n)}`" for n in lengths if n != length]
    searched = [f"params.`train.{key}`" for key in config.search]

    def view(phase: str, aggregate: str) -> dict[str, Any]:
        # a confirmation run is told apart by its seed, a tuning trial by its number
        which = Tag.SEED if phase == Phase.CONFIRM else Tag.TRIAL_NUMBER
        columns = [*lengths_columns, f"tags.`{which}`", *searched]
        return {
            "searchFilter": f"tags.`{Tag.PHASE}` = '{phase}'",
            "orderByKey": f"metrics.`{objective}`", "orderByAsc": not maximize,
            "groupBy": {"aggregateFunction": aggregate,
                        "groupByKeys": [{"mode": "tag", "groupByData": Tag.CANDIDATE}]},
            "groupsExpanded": {}, "selectedColumns": columns, "columnOrder": columns,
            "columnWidths": {columns[0]: 170},
            "runsHiddenMode": "SHOW_ALL", "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
            **charts(metric, objective, phase),
        }

    return {view_key(name): view(Phase.CONFIRM, "average"),
            view_key(name, TUNING): view(Phase.TUNE, "max" if maximize else "min")}


#: Sections of the chart view after the first, in order; ``cost`` collapsed. Charts of metrics
#: the view does not name are added by MLflow to the section of their key's prefix.
CHART_SECTIONS = (("val", True), ("extrapolation", True), ("train", True), ("cost", False),
                  ("Model metrics", True), ("System metrics", False))


def charts(metric: str, objective: str, phase: str) -> dict[str, Any]:
    """The chart view's first section (the objective per candidate, the metric by evaluation
    length, the learning curves) and the sections after it (:data:`CHART_SECTIONS`)."""
    first = "first"
    line = {"type": "LINE", "xAxisKey": "step", "useGlobalXaxisKey": False, "lineSmoothness": 0,
            "useGlobalLineSmoothing": False, "scaleType": "linear", "xAxisScaleType": "linear",
            "selectedXAxisMetricKey": "", "runsCountToCompare": 100, "deleted": False,
            "isGenerated": False, "metricSectionId": first}
    runs = "mean over each candidate's confirmation seeds" if phase == Phase.CONFIRM else \
        "best tuning trial of each candidate"
    cards = [
        {"uuid": "objective", "type": "BAR", "metricKey": objective, "runsCountToCompare": 100,
         "deleted": False, "isGenerated": False, "metricSectionId": first,
         "displayName": f"{objective}: the objective ({runs})"},
        {**line, "uuid": "by-length", "metricKey": curve_key(metric),
         "selectedMetricKeys": [curve_key(metric)],
         "displayName": f"val/{metric} by evaluation length (x: the length)"},
        {**line, "uuid": "learning", "metricKey": val_key(metric),
         "selectedMetricKeys": [val_key(metric)],
         "displayName": f"{val_key(metric)} while training (x: optimizer step)"},
    ]
    title = "Candidates: confirmed means" if phase == Phase.CONFIRM else "Candidates: best trials"
    sections = [{"uuid": first, "name": title, "display": True, "isReordered": True,
                 "deleted": False, "isGenerated": False}]
    sections += [{"uuid": f"section-{name}", "name": name, "display": shown, "isReordered": False,
                  "deleted": False, "isGenerated": True} for name, shown in CHART_SECTIONS]
    return {"compareRunCharts": cards, "compareRunSections": sections, "isAccordionReordered": True}


def publish_view(handle: StudyHandle) -> None:
    """Store the study's views on its experiment (idempotent)."""
    import json

    experiment = handle.experiment_id()
    tags = handle.tracker.client.get_experiment(experiment).tags
    for key, state in study_views(handle.name, handle.config, handle.record).items():
        value = json.dumps(state)
        if tags.get(VIEW_TAG + key) != value:
            handle.tracker.client.set_experiment_tag(experiment, VIEW_TAG + key, value)
