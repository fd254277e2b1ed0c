"""The report's numbers for other programs and for papers: ``candidates.csv`` (one row per
candidate), ``seeds.csv`` (one row per confirmation run), ``table.tex`` (a booktabs table with
the interval and the best-group marks of the Markdown) and ``summary.json``.

Everything here is computed from analysed :class:`~.collect.CandidateResult` s and the
:class:`~.verdict.Verdict`, never read from the stores, so the exports are deterministic for
given results (``tests/golden/``).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from harness.errors import ConfigError
from harness.keys import val_key
from harness.report import stats
from harness.report.collect import CandidateResult, Comparison, Protocol
from harness.report.render import fmt, seed_list
from harness.report.verdict import Verdict

FORMATS = ("md", "html", "csv", "latex", "json")
DEFAULT_FORMATS = ("md", "html", "json")
#: The files each format writes.
FILES = {"md": ("results.md",), "html": ("results.html",), "csv": ("candidates.csv", "seeds.csv"),
         "latex": ("table.tex",), "json": ("summary.json",)}


def parse_formats(values: Iterable[str] | None) -> tuple[str, ...]:
    """``--format`` values (repeatable, or comma lists) in the order of :data:`FORMATS`."""
    if not values:
        return DEFAULT_FORMATS
    chosen = {v.strip().lower() for value in values for v in value.split(",") if v.strip()}
    chosen = {"md" if v == "markdown" else "latex" if v == "tex" else v for v in chosen}
    unknown = sorted(chosen - set(FORMATS))
    if unknown:
        raise ConfigError(f"--format: unknown format(s) {', '.join(unknown)}; choose from "
                          f"{', '.join(FORMATS)} (repeat the option or give a comma list).")
    return tuple(f for f in FORMATS if f in chosen)


def number(x: float | None) -> str:
    """A CSV number: six significant digits, empty when undefined."""
    return "" if x is None or not math.isfinite(x) else f"{x:.6g}"


def _comparison_columns(prefix: str, cmp: Comparison | None) -> dict[str, str]:
    p = cmp.paired if cmp else None
    return {
        f"{prefix}": cmp.against if cmp else "",
        f"delta_{prefix}": number(p.mean_difference) if p else "",
        f"delta_{prefix}_low": number(p.interval.low) if p else "",
        f"delta_{prefix}_high": number(p.interval.high) if p else "",
        f"relative_{prefix}": number(p.relative_difference) if p else "",
        f"p_better_{prefix}": number(cmp.improvement) if cmp else "",
        f"p_{prefix}": number(p.p_value) if p else "",
        f"p_holm_{prefix}": number(p.p_adjusted) if p else "",
        f"seeds_to_resolve_{prefix}": number(cmp.seeds_needed) if cmp else "",
    }


def csv_text(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def candidates_csv(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> str:
    by_name = {r.name: r for r in results}
    seeds = seed_list(results, protocol)
    rows = []
    for name in verdict.order:
        r = by_name[name]
        ci = r.interval
        values = r.values()
        rows.append({
            "candidate": r.name, "label": r.label, "rank": "" if r.rank is None else str(r.rank),
            "best_group": str(r.best_group).lower(), "on_front": str(r.on_front).lower(),
            "metric": protocol.objective, "n_seeds": str(len(r.seeds)), "mean": number(r.mean),
            "interval_low": number(ci.low if ci else None), "interval_high": number(ci.high if ci else None),
            "interval_method": ci.method if ci else "", "confidence": number(protocol.confidence),
            **{f"seed_{s}": number(values.get(s)) for s in seeds},
            **_comparison_columns("vs_best", r.vs_best),
            **_comparison_columns("vs_baseline", r.vs_baseline),
            "test": protocol.test,
            "params": number(r.cost.get("params")), "params_off_target": number(r.params_off),
            "tokens_per_s": number(r.cost.get("tokens_per_s")),
            "peak_memory_mb": number(r.cost.get("peak_memory")),
            "implementation": r.implementation,
            **{f"tuning_{k}": str(v) for k, v in r.tuning.items()},
        })
    return csv_text(rows)


def seeds_csv(results: list[CandidateResult], protocol: Protocol) -> str:
    from harness.report.collect import cost_value
    from harness.report.render import downstream_keys

    downstream = downstream_keys(results)  # lm-eval metrics of the runs (docs/evaluation.md)

    rows = []
    for r in results:
        for s in r.seeds:
            rows.append({
                "candidate": r.name, "seed": str(s.seed), "run_id": s.run_id,
                protocol.objective: number(s.value),
                "params": number(cost_value(s.metrics, "params")),
                "tokens_per_s": number(cost_value(s.metrics, "tokens_per_s")),
                "peak_memory_mb": number(cost_value(s.metrics, "peak_memory")),
                **{val_key(protocol.metric, n): number(s.metrics.get(val_key(protocol.metric, n)))
                   for n in protocol.lengths},
                **{k: number(s.metrics.get(k)) for k in downstream},
            })
    return csv_text(rows)


# -- LaTeX ----------------------------------------------------------------------------------------
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def tex(text: str) -> str:
    """Text escaped for LaTeX (the candidates' middle dot as a math dot)."""
    return "".join(_TEX.get(c, c) for c in text).replace(" · ", r" $\cdot$ ")


def _tex_num(x: float, digits: int = 3) -> str:
    return fmt(x, digits).replace("–", "---") if math.isfinite(x) else "---"


def _tex_interval(mean: float, ci: stats.Interval | None, bold: bool = False) -> str:
    """``$0.912 \\pm 0.021$`` (symmetric interval: half-width) or ``$0.912^{+0.01}_{-0.02}$``."""
    if not math.isfinite(mean):
        return "---"
    m = _tex_num(mean)
    if ci is None or not ci.defined:
        body = m
    else:
        up, down = ci.high - mean, mean - ci.low
        if math.isclose(up, down, rel_tol=1e-6, abs_tol=1e-12):
            body = rf"{m} \pm {_tex_num(up, 2)}"
        else:
            body = rf"{m}^{{+{_tex_num(up, 2)}}}_{{-{_tex_num(down, 2)}}}"
    return rf"$\mathbf{{{body}}}$" if bold else f"${body}$"


def latex_table(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> str:
    by_name = {r.name: r for r in results}
    n = len(protocol.seeds)
    method = stats.interval_label(n, protocol.confidence)
    best = verdict.best or "the best"
    lines = [
        f"% Study {protocol.study}: {protocol.objective}. Needs \\usepackage{{booktabs}}.",
        r"\begin{table}[t]",
        r"  \centering",
        r"  \caption{" + tex(
            f"{protocol.objective} ({'higher' if protocol.maximize else 'lower'} is better): mean "
            f"over {n} seeds with its {method} interval. Δ: difference from {best} on matched "
            f"seeds; p: {stats.TESTS[protocol.test]}, Holm-adjusted over {verdict.comparisons} "
            f"pair(s). Rank: 1 + the number of candidates resolved better at level "
            f"{verdict.alpha:.3g}.").replace("Δ", r"$\Delta$")
        + (r" Bold: the best group (not resolved from the best)." if verdict.resolved
           else r" No difference is resolved: no candidate is marked.")
        + (r" $\star$: on the quality-versus-cost front." if verdict.front else "")
        + "}",
        rf"  \label{{tab:{re.sub(r'[^A-Za-z0-9:-]', '-', protocol.study)}}}",
        r"  \begin{tabular}{rlllllr}",
        r"    \toprule",
        r"    Rank & Candidate & Model & " + tex(protocol.objective)
        + r" & $\Delta$ vs.\ best & $p$ (Holm) & Params \\",
        r"    \midrule",
    ]
    for name in verdict.order:
        r = by_name[name]
        cmp = r.vs_best.paired if r.vs_best else None
        rank = "---" if r.rank is None else str(r.rank) + (r"$^\star$" if r.on_front else "")
        params = r.cost.get("params", math.nan)
        cells = [
            rank, tex(r.name), tex(r.label),
            _tex_interval(r.mean, r.interval, bold=r.best_group and verdict.resolved),
            _tex_interval(cmp.mean_difference, cmp.interval) if cmp else "---",
            _tex_num(cmp.p_adjusted) if cmp else "---",
            f"{params:,.0f}".replace(",", "{,}") if math.isfinite(params) else "---",
        ]
        lines.append("    " + " & ".join(cells) + r" \\")
    lines += [r"    \bottomrule", r"  \end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


# -- JSON -----------------------------------------------------------------------------------------
def summary(results: list[CandidateResult], verdict: Verdict, protocol: Protocol,
            **extra: Any) -> dict[str, Any]:
    """The report's numbers (``summary.json``, ``harness.study_summary``); undefined numbers
    are ``None``."""
    def comparison(c: Comparison | None) -> dict[str, Any] | None:
        return None if c is None else {
            "against": c.against, **asdict(c.paired), "p_better": c.improvement,
            "p_better_interval": asdict(c.improvement_interval), "seeds_to_resolve": c.seeds_needed}

    return finite({
        "study": protocol.study, "complete": protocol.complete, **extra,
        "objective": {"metric": protocol.metric, "maximize": protocol.maximize,
                      "length": protocol.length},
        "baseline": protocol.baseline, "confidence": protocol.confidence, "alpha": verdict.alpha,
        "test": protocol.test, "comparisons": verdict.comparisons,
        "resolvable": verdict.floor.possible, "seeds_needed_to_resolve_anything":
            verdict.floor.seeds_needed,
        "best": verdict.best, "best_group": verdict.best_group, "resolved": verdict.resolved,
        "front": verdict.front, "front_note": verdict.front_note,
        "param_notes": verdict.param_notes, "fixed_differences": verdict.fixed_differences,
        "vary_data": protocol.vary_data,
        "candidates": [
            {"name": r.name, "label": r.label, "rank": r.rank, "best_group": r.best_group,
             "on_front": r.on_front, "mean": r.mean,
             "interval": asdict(r.interval) if r.interval else None,
             "values": {str(s.seed): s.value for s in r.seeds},
             "runs": {str(s.seed): s.run_id for s in r.seeds},
             "vs_best": comparison(r.vs_best), "vs_baseline": comparison(r.vs_baseline),
             "cost": r.cost, "params_off_target": r.params_off,
             "by_length": {str(n): v for n, v in r.by_length.items()},
             "tuning": r.tuning, "best_trial": r.best_trial, "best_value": r.best_value,
             "range_edges": r.edges, "failed_seeds": {str(k): v for k, v in r.failed_seeds.items()}}
            for r in (next(x for x in results if x.name == n) for n in verdict.order)
        ],
    })


def finite(x: Any) -> Any:
    """JSON has no NaN or infinity: undefined numbers (one seed, no value) become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x
