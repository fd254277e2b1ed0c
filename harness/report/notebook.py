"""A study's runs and numbers for notebooks: :func:`study_runs` (a pandas DataFrame, one row
per run) and :func:`study_summary` (the report's numbers). Both only read the stores."""

from __future__ import annotations

import math
from typing import Any

from harness.keys import Tag
from harness.study.storage import StudyHandle


def open_handle(study: str, storage: str | None = None, tracking_uri: str | None = None) -> StudyHandle:
    """An existing study by name (its storage: ``storage``, else the default one)."""
    from harness.study.storage import default_storage_url, open_storage, open_study

    url = storage or default_storage_url()
    return open_study(study, open_storage(url, must_exist=True), url, tracking_uri)


def study_runs(study: str, storage: str | None = None, tracking_uri: str | None = None) -> Any:
    """One row per run of the study (tuning trials and confirmation seeds, failed and pruned
    ones too): ``candidate``, ``phase``, ``trial``, ``seed``, ``status``, ``run_id``,
    ``run_name``, ``objective`` (the study's objective metric), the costs (``n_params``,
    ``tokens_per_s``, ``peak_memory_mb``), then every resolved hyper-parameter as
    ``params.<key>`` and every final metric as ``metrics.<key>`` (MLflow's column names)."""
    import pandas as pd

    from harness.keys import val_key
    from harness.report.collect import child_runs, cost_value

    handle = open_handle(study, storage, tracking_uri)
    cfg = handle.config
    objective = val_key(cfg.objective.metric, cfg.objective.length or int(handle.record["train_length"])) \
        if cfg.objective.over == "length" else val_key(cfg.objective.name)  # over the grid: val/recall_grid
    rows = []
    for run in child_runs(handle).values():
        tags, metrics = run.data.tags, run.data.metrics
        number = tags.get(Tag.TRIAL_NUMBER)
        seed = tags.get(Tag.SEED)
        rows.append({
            "candidate": tags.get(Tag.CANDIDATE), "phase": tags.get(Tag.PHASE),
            "trial": int(number) if number is not None else None,
            "seed": int(seed) if seed is not None else None,
            "status": "PRUNED" if tags.get(Tag.PRUNED) == "true" else run.info.status,
            "run_id": run.info.run_id, "run_name": run.info.run_name,
            "objective": metrics.get(objective, math.nan),
            "n_params": cost_value(metrics, "params"),
            "tokens_per_s": cost_value(metrics, "tokens_per_s"),
            "peak_memory_mb": cost_value(metrics, "peak_memory"),
            **{f"params.{k}": v for k, v in sorted(run.data.params.items())},
            **{f"metrics.{k}": v for k, v in sorted(metrics.items())},
        })
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    order = {c.name: i for i, c in enumerate(cfg.candidates)}
    frame = frame.sort_values(
        ["candidate", "phase", "trial"], key=lambda col: col.map(order) if col.name == "candidate"
        else col.map({"tune": 0, "confirm": 1}) if col.name == "phase" else col)
    return frame.reset_index(drop=True).astype({"trial": "Int64", "seed": "Int64"})


def study_summary(study: str, storage: str | None = None, tracking_uri: str | None = None) -> dict[str, Any]:
    """The report's numbers (as in its ``summary.json``): per candidate the mean, interval,
    seeds, rank, best group, comparisons with the best and the baseline (effect sizes,
    p-values, seeds to resolve), costs and by-length values; for the study the best group,
    the front and whether its seeds can resolve anything. ``pandas.DataFrame(
    summary["candidates"])`` gives one row per candidate. A scaling study adds ``scaling``
    (its ``scaling.json``: fits, iso-FLOP profiles, crossovers, runs);
    ``pandas.DataFrame(summary["scaling"]["fits"])`` gives one row per candidate's fit."""
    from harness.report import scaling
    from harness.report.export import summary
    from harness.report.write import analysed

    handle = open_handle(study, storage, tracking_uri)
    results, verdict, proto = analysed(handle, settle=False)
    out = dict(summary(results, verdict, proto, parent_run_id=handle.parent_run_id))
    analysis = scaling.analyse(handle.config, results, confidence=proto.confidence)
    if analysis is not None:
        out["scaling"] = scaling.summary(analysis)
    return out


__all__ = ["open_handle", "study_runs", "study_summary"]
