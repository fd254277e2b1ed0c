"""The report as blocks: what it says, in which order. Rendered as Markdown and HTML by
:mod:`.render`; the figures and the store-dependent sections (Optuna plots, attention maps,
best configurations) are passed in by :mod:`.write`, so a report can be built from results
made by hand (the golden files are)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.report.collect import CandidateResult, Protocol
from harness.report.render import (
    Block,
    comparison_table,
    downstream_table,
    first_line,
    fixed_table,
    headline,
    length_table,
    protocol_text,
    ranked_table,
    variance_text,
    verdict_text,
)
from harness.report.verdict import PARAM_TOLERANCE, Verdict


def document(results: list[CandidateResult], verdict: Verdict, protocol: Protocol, *,
             seeds_figure: Path | None = None, figures: Sequence[tuple[str, Path]] = (),
             extra: Sequence[Block] = ()) -> list[Block]:
    """Every block of the report, the warning (if any) first."""
    blocks: list[Block] = []
    warning = first_line(verdict, protocol)
    if warning:
        blocks.append(("warn", warning))
    blocks.append(("h1", f"Study {protocol.study}"))
    if protocol.description:
        blocks.append(("p", protocol.description))
    if protocol.data:  # what was read, not what the description or the defaults suggest
        blocks.append(("p", f"Data read: {protocol.data}."))
    blocks.append(("h2", "Verdict"))
    blocks.append(("p", headline(results, verdict, protocol)))
    blocks += [("p", s) for s in verdict_text(results, verdict, protocol)]
    blocks.append(("h2", "Ranking"))
    blocks.append(ranked_table(results, verdict, protocol))
    blocks.append(("p", _ranking_notes(verdict)))
    if seeds_figure is not None:
        blocks.append(("img", (seeds_figure.name, "Every confirmation seed per candidate")))
    comparisons = comparison_table(results, verdict, protocol)
    if comparisons[1][1]:
        blocks.append(("h2", "Comparisons (effect sizes first)"))
        blocks.append(comparisons)
        blocks.append(("p", "Δ: candidate minus the other, on the seeds both have. P(candidate "
                            "better): the share of (candidate seed, other seed) pairs where the "
                            "candidate is better, ties counting one half (rliable's probability "
                            "of improvement), with a bootstrap interval that resamples each "
                            "candidate's seeds separately. Seeds to resolve: the paired t-test's "
                            "sample size at the family's smallest Holm threshold, if the "
                            "observed difference and spread held (both are uncertain at few "
                            "seeds); never fewer than the test needs to reach the level at all."))
    blocks.append(("h2", "Parameters"))
    blocks += [("p", n) for n in verdict.param_notes]
    edges = [f"{r.name}: {'; '.join(r.edges)}" for r in results if r.edges]
    if edges:
        blocks.append(("p", "Tuned values at the edge of their searched range (the optimum may "
                            "lie outside it, a handicap the ranking does not show; widen the "
                            "range and re-run): " + ". ".join(edges) + "."))
    if protocol.param_target and not verdict.param_notes:
        blocks.append(("p", f"Every candidate is within {PARAM_TOLERANCE:.0%} of the target "
                            f"budget.params = {protocol.param_target:,} parameters."))
    if verdict.fixed_differences:
        blocks.append(("p", "Fixed (not searched) hyper-parameters that differ between "
                            "candidates — check that none handicaps a candidate:"))
        blocks.append(fixed_table(results, verdict))
    else:
        blocks.append(("p", "No fixed (not searched) hyper-parameter differs between candidates."))
    blocks.append(("h2", "Protocol"))
    blocks.append(("p", protocol_text(protocol, verdict)))
    if protocol.transfer:
        blocks.append(("p", tuned_elsewhere(results)))
    blocks.append(("p", variance_text(protocol)))
    if len(protocol.lengths) > 1:
        blocks.append(("h2", f"val/{protocol.metric} by evaluation length (mean over seeds)"))
        blocks.append(length_table(results, protocol))
        if any(v is None for r in results for v in r.by_length.values()):
            blocks.append(("p", "n/a: the model cannot run at that length (for example a learned "
                                "position table or a fixed-length mixer)."))
    table = downstream_table(results, protocol)
    if table is not None:
        blocks.append(("h2", "Downstream tasks (lm-eval, mean over confirmation seeds)"))
        blocks.append(table)
        blocks.append(("p", f"Each confirmation run scored on lm-eval tasks after training "
                            f"(study `downstream:`; docs/evaluation.md); brackets: the "
                            f"{protocol.confidence:.0%} interval of the mean over seeds. Not the "
                            f"objective: the ranking above does not use them."))
    for title, path in figures:
        blocks += [("h2", title), ("img", (path.name, title))]
    return blocks + list(extra)


def _ranking_notes(verdict: Verdict) -> str:
    parts = []
    if verdict.resolved:
        parts.append("Bold: the best group (the best mean and every candidate not resolved "
                     "from it).")
    else:
        parts.append("No mean is bold: no candidate is resolved from the best.")
    parts.append(verdict.front_note)
    parts.append("Seeds: the objective of each confirmation run, in seed order. Cost columns "
                 "are means over the confirmation seeds; ⚠: parameter count more than "
                 f"{PARAM_TOLERANCE:.0%} off budget.params.")
    return " ".join(parts)


def tuned_elsewhere(results: list[CandidateResult]) -> str:
    """Which width each candidate was tuned at and which it was confirmed at (a study with
    ``transfer``: harness.study.transfer)."""
    parts = []
    for r in results:
        model = (r.best_config or {}).get("model") or {}
        base = model.get("base") or {}
        if base:
            widths = ", ".join(f"{k} {v} (confirmed at {r.config.get(f'model.params.{k}', '?')})"
                               for k, v in base.items())
            parts.append(f"{r.name} at {widths}")
    return ("Tuned at another width than confirmed, in μP, its tuned values transferred unchanged: "
            + ("; ".join(parts) or "no candidate's tuning configuration was recorded") + ".")

