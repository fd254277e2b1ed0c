"""The study's parent MLflow run as its summary, readable in the MLflow UI.

The params (the protocol) are logged when the study is created
(:func:`harness.study.summary.protocol_params`).

Metrics and description (logged when the study completes and whenever its report is
written, :func:`write_summary`), per candidate:

    <cand>/mean, <cand>/ci_low, <cand>/ci_high   the objective over the confirmation seeds
    <cand>/rank                                   1 is best; ties share a rank
    <cand>/val/<metric>_len<L>                    mean over seeds at each evaluation length
    <cand>/extrapolation/<metric>                 the same, with the length as the step

and the ranked table as the run's Markdown note (the ``mlflow.note.content`` tag), which the
UI shows as the run's description. The numbers are the report's (:mod:`harness.report.collect`),
read through :func:`report_numbers`, the one place that knows that module's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.keys import curve_key, val_key
from harness.study.schema import StudyConfig
from harness.study.storage import StudyHandle
from harness.study.summary import NOTE_TAG


# -- the parent run's numbers --------------------------------------------------------------------
@dataclass
class CandidateNumbers:
    """What the parent run shows of one candidate."""

    name: str
    rank: float
    mean: float
    ci: tuple[float, float]
    seeds: dict[int, float]
    by_length: dict[int, float | None] = field(default_factory=dict)  # None: not applicable


def report_numbers(handle: StudyHandle) -> tuple[list[CandidateNumbers], str, str]:
    """The adapter to the report: each candidate's numbers, the ranked table (Markdown) and
    the interval's method (``95% Student t``)."""
    from harness.report.render import methods, ranked_table, render_markdown
    from harness.report.write import analysed

    results, verdict, proto = analysed(handle, settle=False)
    table = render_markdown([ranked_table(results, verdict, proto)])
    numbers = []
    for r in results:
        ci = (r.interval.low, r.interval.high) if r.interval is not None else (math.nan, math.nan)
        numbers.append(CandidateNumbers(r.name, math.nan if r.rank is None else float(r.rank),
                                        r.mean, ci, r.values(), dict(r.by_length)))
    return numbers, table, methods(results, proto)


def summary_metrics(config: StudyConfig, numbers: list[CandidateNumbers]
                    ) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    """The parent run's metrics (step 0) and its per-length curves (step = length); undefined
    numbers (no seed finished, one seed's interval) are left out."""
    metric = config.objective.metric
    flat: dict[str, float] = {}
    curves: dict[str, dict[int, float]] = {}
    for c in numbers:
        values = {"mean": c.mean, "ci_low": c.ci[0], "ci_high": c.ci[1], "rank": c.rank}
        for length, value in c.by_length.items():
            if value is not None:
                values[val_key(metric, length)] = value
                if math.isfinite(value):
                    curves.setdefault(f"{c.name}/{curve_key(metric)}", {})[length] = value
        flat.update({f"{c.name}/{k}": v for k, v in values.items() if math.isfinite(v)})
    return flat, curves


def note(handle: StudyHandle, numbers: list[CandidateNumbers], table: str, method: str) -> str:
    """The parent run's description (Markdown)."""
    cfg = handle.config
    length = cfg.objective.length or int(handle.record["train_length"])
    seeds = ", ".join(map(str, cfg.confirm_seeds()))
    complete = all(len(c.seeds) == cfg.confirm.seeds for c in numbers)
    lines = [
        f"**Study {handle.name}**: {cfg.objective.direction} val/{cfg.objective.metric} at "
        f"evaluation length {length}; mean and {method} interval "
        f"over the confirmation seeds ({seeds}); Δ and p against the baseline {cfg.baseline} "
        f"on matched seeds."
        + ("" if complete else " **Not every confirmation seed has finished.**"),
        "",
        table.strip(),
        "",
        f"Child runs are named `CANDIDATE/tune/trial-N` and `CANDIDATE/confirm/seed-S` and tagged "
        f"`harness.candidate`, `harness.phase`, `harness.seed`, `harness.trial_number`: group by "
        f"`harness.candidate` to compare. Per candidate, this run's metrics hold the objective's "
        f"mean and interval (`CANDIDATE/mean`, `/ci_low`, `/ci_high`) and the value at each "
        f"evaluation length (`CANDIDATE/{curve_key(cfg.objective.metric)}`, step = length). "
        f"The full report (figures, tables) is under this run's artifacts, `report/`, once "
        f"`harness report {handle.name}` ran.",
    ]
    return "\n".join(lines)


def write_summary(handle: StudyHandle) -> None:
    """Log the summary to the parent run: metrics that changed, the per-length curves and the
    description (repeating it with the same numbers logs nothing new)."""
    numbers, table, method = report_numbers(handle)
    flat, curves = summary_metrics(handle.config, numbers)
    run = handle.tracker.client.get_run(handle.parent_run_id)
    logged = run.data.metrics
    changed = {k: v for k, v in flat.items() if logged.get(k) != v}
    if changed:
        handle.tracker.log_metrics(handle.parent_run_id, changed)
    touched = {k.split("/", 1)[0] for k in changed}  # candidates whose numbers changed
    new_curves = {k: points for k, points in curves.items() if k.split("/", 1)[0] in touched}
    if new_curves:
        handle.tracker.log_series(handle.parent_run_id, new_curves)
    text = note(handle, numbers, table, method)
    if run.data.tags.get(NOTE_TAG) != text:
        handle.tracker.set_tags(handle.parent_run_id, {NOTE_TAG: text})
