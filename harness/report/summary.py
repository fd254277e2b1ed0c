"""The study's parent MLflow run as its summary, readable in the MLflow UI.

The params (the protocol) are logged when the study is created
(:func:`harness.study.schema.protocol_params`).

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


@dataclass
class VerdictText:
    """The verdict in the forms the parent run shows: its title, the ranking on one line
    and the verdict in one paragraph (Markdown)."""

    title: str
    ranked: str
    headline: str
    data: str = ""  # what the runs read (a prepared corpus's manifest); empty: generated data

    def text(self) -> str:
        """For stdout: the ranking and the verdict, without the Markdown marks (wrapped at a
        terminal only: :func:`harness.errors.fill`)."""
        import sys

        from harness.errors import fill

        return "\n".join(fill(part.replace("**", ""), sys.stdout, indent="  ")
                         for part in (f"verdict: {self.title}", self.headline))


def report_numbers(handle: StudyHandle) -> tuple[list[CandidateNumbers], str, str, VerdictText]:
    """The adapter to the report: each candidate's numbers, the ranked table (Markdown), the
    interval's method (``95% Student t``) and the verdict (:class:`VerdictText`)."""
    from harness.report.render import (
        headline,
        methods,
        ranked_line,
        ranked_table,
        render_markdown,
        short_verdict,
    )
    from harness.report.write import analysed

    results, verdict, proto = analysed(handle, settle=False)
    table = render_markdown([ranked_table(results, verdict, proto)])
    lead = VerdictText(short_verdict(results, verdict), ranked_line(results, verdict, proto),
                       headline(results, verdict, proto), proto.data)
    numbers = []  # in the table's order: best first
    by_name = {r.name: r for r in results}
    for r in (by_name[name] for name in verdict.order):
        ci = (r.interval.low, r.interval.high) if r.interval is not None else (math.nan, math.nan)
        numbers.append(CandidateNumbers(r.name, math.nan if r.rank is None else float(r.rank),
                                        r.mean, ci, r.values(), dict(r.by_length)))
    return numbers, table, methods(results, proto), lead


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


def note(handle: StudyHandle, numbers: list[CandidateNumbers], table: str, method: str,
         lead: VerdictText | None = None) -> str:
    """The parent run's description (Markdown). The UI shows a description's first 100
    pixels (about five lines) and hides the rest behind "Show more": so the ranking comes
    first, on one line, then the verdict in one paragraph (differences from the best, their
    intervals and adjusted p-values), then a compact table, the full table and the legend.
    ``@`` is spelled out (the UI turns ``@6`` into a link to a GitHub user)."""
    cfg = handle.config
    length = cfg.objective.length or int(handle.record["train_length"])
    seeds = ", ".join(map(str, cfg.confirm_seeds()))
    complete = all(len(c.seeds) == cfg.confirm.seeds for c in numbers)
    lines = [] if lead is None else [lead.ranked, "", lead.headline, ""]
    if not complete:
        lines = ["**Not every confirmation seed has finished.**", "", *lines]
    lines += [
        compact_table(numbers, f"val/{cfg.objective.metric} @{length}" if cfg.objective.over == "length"
                      else val_key(cfg.objective.name), method),
        "",
        f"**Study {handle.name}**: {cfg.objective.direction} "
        + (f"val/{cfg.objective.metric} at evaluation length {length}" if cfg.objective.over == "length"
           else cfg.objective.words) + f"; mean and {method} interval "
        f"over the confirmation seeds ({seeds}); Δ and p against the baseline {cfg.baseline} "
        f"on matched seeds."
        + (f" Data read: {lead.data}." if lead is not None and lead.data else "")
        + ("" if complete else " **Not every confirmation seed has finished.**"),
        "",
        table.strip(),
        "",
        "In the study's ranked runs view (`harness ui`) a candidate's group row shows the mean "
        "over its confirmation seeds without its interval: MLflow groups by min, average or max "
        "only. The intervals are in the tables above (and in `CANDIDATE/ci_low`, `/ci_high`).",
        "",
        f"Child runs are named `CANDIDATE/tune/trial-N` and `CANDIDATE/confirm/seed-S` and tagged "
        f"`harness.candidate`, `harness.phase`, `harness.seed`, `harness.trial_number`: group by "
        f"`harness.candidate` to compare. Per candidate, this run's metrics hold the objective's "
        f"mean and interval (`CANDIDATE/mean`, `/ci_low`, `/ci_high`) and the value at each "
        f"evaluation length (`CANDIDATE/{curve_key(cfg.objective.metric)}`, step = length). "
        f"The full report (figures, tables) is under this run's artifacts, `report/`, once "
        f"`harness report {handle.name}` ran; `report/extrapolation.png` draws every "
        f"candidate's mean by evaluation length on one chart, with its interval.",
    ]
    return "\n".join(lines)


def compact_table(numbers: list[CandidateNumbers], objective: str, method: str) -> str:
    """Rank, candidate and mean with its interval, in the order of ``numbers`` (the table's,
    best first): the table that fits the first screen of the parent run (the full one
    follows)."""
    rows = [f"| rank | candidate | {objective}: mean [{method} interval] |", "|---|---|---|"]
    for c in numbers:
        rank = f"{c.rank:.0f}" if math.isfinite(c.rank) else "–"
        ci = (f" [{c.ci[0]:.4g}, {c.ci[1]:.4g}]" if all(map(math.isfinite, c.ci)) else
              " (one seed)" if len(c.seeds) == 1 else "")
        mean = f"{c.mean:.4g}{ci}" if math.isfinite(c.mean) else "–"
        rows.append(f"| {rank} | {c.name} | {mean} |")
    return "\n".join(rows)


def write_summary(handle: StudyHandle) -> VerdictText:
    """Log the summary to the parent run: metrics that changed, the per-length curves, the
    description and the verdict in its name (repeating it with the same numbers logs nothing
    new); returns the verdict, for the terminal (:meth:`VerdictText.text`)."""
    numbers, table, method, lead = report_numbers(handle)
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
    text = note(handle, numbers, table, method, lead).replace(" @", " at length ")
    if run.data.tags.get(NOTE_TAG) != text:
        handle.tracker.set_tags(handle.parent_run_id, {NOTE_TAG: text})
    title = f"{handle.name} · {lead.title}"  # the run page's title: the answer, first
    if run.info.run_name != title:
        handle.tracker.rename(handle.parent_run_id, title)
    return lead
