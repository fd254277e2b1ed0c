"""The report's text: blocks (headings, paragraphs, tables, figures, code) rendered as
Markdown and as HTML, the report's tables, and number formatting.

A block is ``(kind, value)``; the report is built once as blocks and written in every
format, so the formats never disagree. A table cell is a ``str``; a :class:`Strong` cell is
shown in bold (the best group). Undefined numbers are shown as such ("–", "n/a"), never as a
misleading value; HTML is escaped and a pipe inside a Markdown cell does not split it.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from harness.report import stats
from harness.report.collect import CandidateResult, Comparison, Protocol
from harness.report.verdict import PARAM_TOLERANCE, POWER, Verdict

Block = tuple[str, Any]


class Strong(str):
    """A table cell shown in bold: a member of the best group (when the group is not
    everyone, so the mark says something)."""

    __slots__ = ()


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}g}" if math.isfinite(x) else "–"


def count(x: float | None) -> str:
    """Parameters, tokens/s, megabytes: whole numbers with thousands separators."""
    return f"{x:,.0f}" if x is not None and math.isfinite(x) else "–"


def interval(mean: float, ci: stats.Interval | None) -> str:
    if not math.isfinite(mean):
        return "–"
    if ci is None or not ci.defined:
        return f"{fmt(mean)} (one seed)"
    return f"{fmt(mean)} [{fmt(ci.low)}, {fmt(ci.high)}]"


def percent(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "–"


def p_text(p: float) -> str:
    return "–" if not math.isfinite(p) else "< 0.001" if p < 0.001 else f"{p:.3g}"


def seeds_text(n: float, difference: float = math.nan) -> str:
    """How many seeds would resolve a comparison; ``difference``: its observed mean
    difference (exactly 0: no number of seeds resolves it, and that is what to say)."""
    if difference == 0:
        return "none: no difference observed"
    if math.isnan(n):
        return "–"
    return "more than 10,000" if math.isinf(n) else f"about {n:,.0f}"


#: A relative mean difference below this is rounding, not a difference: metrics are logged as
#: float32 (about 7 significant digits), so seeds at 0.525, 0.475 and 0.5 against 0.5 each
#: average to about -1e-8, not 0.
ROUNDING = 1e-6


def seeds_for(cmp: Comparison) -> str:
    """:func:`seeds_text` of a comparison (a difference within :data:`ROUNDING` counts as 0)."""
    paired = cmp.paired
    rounding = math.isfinite(paired.relative_difference) and abs(paired.relative_difference) < ROUNDING
    return seeds_text(cmp.seeds_needed, 0.0 if rounding else paired.mean_difference)


def methods(results: list[CandidateResult], protocol: Protocol) -> str:
    """The interval method(s) of a column, for its header: ``95% Student t``."""
    labels = sorted({r.interval.label for r in results if r.interval is not None})
    return " / ".join(labels) or stats.interval_label(len(protocol.seeds), protocol.confidence)


def seed_list(results: list[CandidateResult], protocol: Protocol) -> list[int]:
    return sorted({s.seed for r in results for s in r.seeds} | set(protocol.seeds))


# -- tables ------------------------------------------------------------------------------------
def ranked_table(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> Block:
    by_name = {r.name: r for r in results}
    seeds = seed_list(results, protocol)
    header = ["rank", "candidate", "model · attention · position",
              f"{protocol.objective}: mean [{methods(results, protocol)} interval]",
              "seeds " + ", ".join(map(str, seeds)), "params", "tokens/s", "peak MB",
              "implementation", "tuning: done (pruned, failed) / budget"]
    state = protocol.front_cost == "state_size"  # the front's cost gets a column of its own
    if state:
        header.insert(-1, "decoding state")
    rows = []
    for name in verdict.order:
        r = by_name[name]
        values = r.values()
        mean = interval(r.mean, r.interval)
        t = r.tuning
        params = count(r.cost.get("params"))
        if r.params_off is not None and abs(r.params_off) > PARAM_TOLERANCE:
            params += f" ⚠ {r.params_off:+.0%}"
        rows.append([
            "–" if r.rank is None else f"{r.rank}" + (" ★" if r.on_front else ""), r.name, r.label,
            Strong(mean) if r.best_group and verdict.resolved else mean,
            ", ".join(fmt(values.get(s, math.nan)) for s in seeds), params,
            count(r.cost.get("tokens_per_s")), count(r.cost.get("peak_memory")), r.implementation,
            f"{t['complete'] + t['pruned'] + t['failed']} ({t['pruned']}, {t['failed']}) / {t['budget']}"
            + (" (not tuned)" if protocol.untuned else ""),
        ])
        if state:
            rows[-1].insert(-1, count(r.cost.get("state_size")))
    return "table", (header, rows)


def comparison_table(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> Block:
    """Effect sizes first (difference, its interval, relative difference, P(X > Y)), then
    the p-values and how many seeds would resolve the difference."""
    by_name = {r.name: r for r in results}
    label = methods(results, protocol)
    header = ["candidate", "against", f"Δ mean [{label} interval]", "Δ relative",
              f"P(candidate better) [{protocol.confidence:.0%} percentile bootstrap]",
              f"p ({stats.TESTS[protocol.test]})", f"p, Holm over {verdict.comparisons} pair(s)",
              "resolved", f"seeds to resolve ({POWER:.0%} power)"]
    rows = []
    for name in verdict.order:
        r = by_name[name]
        for cmp, role in ((r.vs_best, "best"), (r.vs_baseline, "baseline")):
            if cmp is None or (role == "baseline" and r.vs_best is not None
                               and cmp.against == r.vs_best.against):
                continue
            rows.append(_comparison_row(r, cmp, role, verdict))
    return "table", (header, rows)


def _comparison_row(r: CandidateResult, cmp: Comparison, role: str, verdict: Verdict) -> list[str]:
    p = cmp.paired
    resolved = p.p_adjusted <= verdict.alpha
    improve = fmt(cmp.improvement, 2)
    if cmp.improvement_interval.defined:
        improve += f" [{fmt(cmp.improvement_interval.low, 2)}, {fmt(cmp.improvement_interval.high, 2)}]"
    return [r.name, f"{cmp.against} ({role})", interval(p.mean_difference, p.interval),
            percent(p.relative_difference), improve, p_text(p.p_value), p_text(p.p_adjusted),
            "yes" if resolved else "no", "–" if resolved else seeds_for(cmp)]


def length_table(results: list[CandidateResult], protocol: Protocol) -> Block:
    header = ["candidate"] + [f"{n}" + (" (train)" if n == protocol.train_length else "")
                              for n in protocol.lengths]
    rows = [[r.name] + [fmt(r.by_length.get(n)) for n in protocol.lengths] for r in results]
    return "table", (header, rows)


def downstream_keys(results: list[CandidateResult]) -> list[str]:
    """The lm-eval metrics (``eval/<task>/<metric>``, no stderr) of the confirmation runs."""
    return sorted({k for r in results for s in r.seeds for k in s.metrics
                   if k.startswith("eval/") and not k.endswith("_stderr")})


def downstream_table(results: list[CandidateResult], protocol: Protocol) -> Block | None:
    """Per candidate, each downstream metric's mean over its confirmation seeds with its
    interval (the statistics of every other metric: :func:`stats.mean_interval`)."""
    keys = downstream_keys(results)
    if not keys:
        return None
    rows = []
    for r in results:
        row = [r.name]
        for key in keys:
            values = [s.metrics[key] for s in r.seeds if key in s.metrics]
            if not values:
                row.append("–")
                continue
            iv = stats.mean_interval(values, protocol.confidence)
            band = f" [{fmt(iv.low)}, {fmt(iv.high)}]" if math.isfinite(iv.low) else ""
            row.append(f"{fmt(stats.mean(values))}{band} (n={len(values)})")
        rows.append(row)
    return "table", (["candidate"] + [k.removeprefix("eval/") for k in keys], rows)


def fixed_table(results: list[CandidateResult], verdict: Verdict) -> Block:
    names = [r.name for r in results]
    rows = [[key] + [values.get(n, "–") for n in names]
            for key, values in verdict.fixed_differences.items()]
    return "table", (["hyper-parameter"] + names, rows)


# -- text ----------------------------------------------------------------------------------------
def first_line(verdict: Verdict, protocol: Protocol) -> str | None:
    """What a reader must know before any number: too few seeds to resolve anything, or a
    study that is not complete."""
    parts = []
    if protocol.untuned:
        parts.append("Shared recipe, not tuned: each candidate ran one configuration (one "
                     "tuning trial), so the ranking is that of the recipe, not of tuned "
                     "candidates.")
    if not verdict.floor.possible and len(verdict.order) - len(verdict.unranked) > 1:
        sentence = verdict.floor.sentence()
        parts.append("Too few seeds: " + sentence[0].upper() + sentence[1:])
    if verdict.failed_seeds:
        parts.append("Failed confirmation seeds: " + "; ".join(verdict.failed_seeds) + ". Means, "
                     "intervals and tests use only the seeds that finished, which flatters a "
                     "configuration that fails on some seeds: read those candidates' ranks as "
                     "conditional on finishing.")
    if not protocol.complete:
        parts.append("The study is not complete: the numbers below are partial.")
    return " ".join(parts) or None


def verdict_text(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> list[str]:
    """The verdict in sentences: the best group, what is resolved (effect sizes first), what
    more seeds would resolve."""
    by_name = {r.name: r for r in results}
    ranked = [by_name[n] for n in verdict.order if n not in verdict.unranked]
    if not ranked:
        return ["No candidate has a finished confirmation run."]
    if len(ranked) == 1:
        return [f"Only {ranked[0].name} has finished confirmation runs: nothing to compare."]
    level = (f"at level {verdict.alpha:.3g}, {stats.TESTS[verdict.test]}, Holm over "
             f"{verdict.comparisons} pair(s)")
    out = []
    if not verdict.resolved:
        out.append(f"No difference is resolved ({level}): all {len(ranked)} candidates are in one "
                   f"group and share rank 1. The ordering of the means below is not evidence "
                   f"that one is better.")
    else:
        group = ", ".join(verdict.best_group)
        out.append(f"Best group (bold): {group} — the best mean ({best_mean(ranked, verdict)}) "
                   f"and every candidate not resolved from it ({level}).")
        below = [r for r in ranked if not r.best_group and r.vs_best is not None]
        out.append("Resolved below the best: " + "; ".join(
            f"{r.name} (Δ = {interval(r.vs_best.paired.mean_difference, r.vs_best.paired.interval)}, "
            f"{percent(r.vs_best.paired.relative_difference)}, adjusted p = "
            f"{p_text(r.vs_best.paired.p_adjusted)})" for r in below if r.vs_best) + ".")
    open_ = [r for r in ranked if r.vs_best is not None and r.best_group]
    if open_:
        out.append("Seeds that would resolve the open comparisons with the best, if the observed "
                   f"difference and spread held ({POWER:.0%} power): " + "; ".join(
                       f"{r.name}: {seeds_for(r.vs_best)}" for r in open_ if r.vs_best) + ".")
    return out


def headline(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> str:
    """The answer in one paragraph, before any table: which candidate is better, by how much
    (each other candidate's difference from the best, with its interval) and how sure (the
    intervals, the adjusted p-values, whether the difference is resolved)."""
    by_name = {r.name: r for r in results}
    ranked = [by_name[n] for n in verdict.order if n not in verdict.unranked]
    if len(ranked) < 2:
        return verdict_text(results, verdict, protocol)[0]
    best = by_name[verdict.best] if verdict.best else ranked[0]
    n = min(len(r.seeds) for r in ranked)
    failed = [r for r in ranked if r.failed_seeds]
    seeds = f"{n} confirmation seed(s)" + (
        f" ({', '.join(f'{r.name}: {len(r.failed_seeds)} failed' for r in failed)})" if failed else "")
    label = best.interval.label if best.interval is not None else ""
    head = (f"{protocol.objective}, mean over {seeds} with its {label} interval: "
            if label else f"{protocol.objective}, mean over {seeds}: ")
    if verdict.resolved and len(verdict.best_group) == 1:
        lead = f"**{best_mean(ranked, verdict)} is best** with {interval(best.mean, best.interval)}."
    elif verdict.resolved:
        lead = (f"**Best: {', '.join(verdict.best_group)}** (not resolved apart); the best mean "
                f"is {best_mean(ranked, verdict)}'s, {interval(best.mean, best.interval)}.")
    else:
        lead = (f"No difference is resolved (level {verdict.alpha:.3g}, Holm over "
                f"{verdict.comparisons} pair(s)); the best mean is {best_mean(ranked, verdict)}'s, "
                f"{interval(best.mean, best.interval)}.")
    others = []
    for r in ranked:
        if r is best or r.vs_best is None:
            continue
        p = r.vs_best.paired
        status = "resolved" if p.p_adjusted <= verdict.alpha else "not resolved"
        others.append(f"{r.name} {fmt(r.mean)} (Δ = {interval(p.mean_difference, p.interval)}, "
                      f"{percent(p.relative_difference)}, adjusted p = {p_text(p.p_adjusted)}: "
                      f"{status})")
    return caveat_text(verdict) + head + lead + (" Against it: " + "; ".join(others) + "." if others else "")


def caveat_text(verdict: Verdict) -> str:
    """The handicaps the report detected (:func:`.verdict.caveats`), first in the verdict:
    ``**Caveats:** the tuned lr of 3 of 4 candidates ...; read the verdict with them.``"""
    if not verdict.caveats:
        return ""
    return ("**Caveats:** " + "; ".join(long for _, long in verdict.caveats)
            + ". Read the verdict below with them. ")


def ranked_line(results: list[CandidateResult], verdict: Verdict, protocol: Protocol) -> str:
    """The ranking on one line (Markdown): ``**1. rope** 0.98 [0.97, 0.99] · 2. nope ...``,
    what fits the few lines a collapsed description shows; the best group in bold, as in the
    report's table (nothing bold when nothing is resolved)."""
    by_name = {r.name: r for r in results}
    ranked = [by_name[n] for n in verdict.order if n not in verdict.unranked]
    label = next((r.interval.label for r in ranked if r.interval is not None), "")
    n = min((len(r.seeds) for r in ranked), default=0)
    def item(r: CandidateResult) -> str:  # bold: the best group, when it is not everyone
        name = f"{r.rank}. {r.name}"
        return (f"**{name}**" if verdict.resolved and r.best_group else name) + " " + \
            interval(r.mean, r.interval)

    return (f"Ranked by {protocol.objective} (mean [{label} interval] over {n} confirmation "
            f"seed(s); a shared rank: not resolved apart): " + " · ".join(map(item, ranked)))


def short_verdict(results: list[CandidateResult], verdict: Verdict) -> str:
    """A few words for a title: ``best: rope 0.98 [0.97, 0.99]`` when resolved, else
    ``no difference resolved (best mean: rope 0.98)``."""
    by_name = {r.name: r for r in results}
    ranked = [by_name[n] for n in verdict.order if n not in verdict.unranked]
    if not ranked or verdict.best is None:
        return "no finished confirmation run"
    best = by_name[verdict.best]
    caveats = ("; caveats: " + ", ".join(short for short, _ in verdict.caveats)
               if verdict.caveats else "")
    if len(ranked) == 1:
        return f"only {best.name}: {fmt(best.mean)}{caveats}"
    if verdict.resolved:
        return (f"best: {', '.join(verdict.best_group)} ({best.name} "
                f"{interval(best.mean, best.interval)}){caveats}")
    return f"no difference resolved (best mean: {best.name} {fmt(best.mean)}){caveats}"


def best_mean(ranked: list[CandidateResult], verdict: Verdict) -> str:
    """The candidate with the best mean, as the table lists it first, and those tied with it:
    ``rope, tied with sinusoidal``."""
    best = next(r for r in ranked if r.name == verdict.best)
    tied = [r.name for r in ranked if r is not best and r.mean == best.mean]
    return best.name + (f", tied with {', '.join(tied)}" if tied else "")


def protocol_text(protocol: Protocol, verdict: Verdict) -> str:
    seeds = ", ".join(map(str, protocol.seeds))
    return (
        f"Task {protocol.task}. Objective: {'maximize' if protocol.maximize else 'minimize'} "
        f"{protocol.objective}"
        + (f" (val/{protocol.metric} at evaluation length {protocol.length}). " if protocol.over == "length" else ". ")
        + f"Protocol: {protocol.tuning}; its best configuration re-run with {len(protocol.seeds)} fresh "
        f"seeds ({seeds}). Intervals of means and of differences: Student t below "
        f"{stats.BCA_MIN_N} seeds, BCa bootstrap ({stats.N_RESAMPLES:,} resamples) from "
        f"{stats.BCA_MIN_N} on, at {protocol.confidence:.0%}. Every pair of candidates is compared "
        f"on matched seeds with the {stats.TESTS[protocol.test]}, and the p-values of all "
        f"{verdict.comparisons} pair(s) are Holm-adjusted together (the table's claims span "
        f"every pair), at level {verdict.alpha:.3g}. Rank = 1 + the number of candidates "
        f"resolved better; candidates nothing separates share a rank."
    )


def variance_text(protocol: Protocol) -> str:
    """Which sources of variance the confirmation seeds vary (Bouthillier et al., 2021)."""
    data = ("the data sample too (confirm.vary_data: the task is rebuilt with data_seed + k for "
            "the k-th seed, the same k for every candidate, so the comparison stays paired)"
            if protocol.vary_data else
            "not the data sample (every run sees the same generated data; confirm.vary_data: "
            "true draws a fresh sample per seed)")
    return (f"Sources of variance: each confirmation seed varies the initialisation and the data "
            f"order (train.seed), and {data}. The hyper-parameter search is not repeated per "
            f"seed, so its variance is not in the intervals (Bouthillier et al., 'Accounting for "
            f"Variance in Machine Learning Benchmarks', MLSys 2021).")


# -- rendering -----------------------------------------------------------------------------------
def _md_cell(c: str) -> str:
    text = c.replace("|", "\\|")
    return f"**{text}**" if isinstance(c, Strong) else text


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for kind, value in blocks:
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + value)
        elif kind == "p":
            out.append(value)
        elif kind == "warn":
            out.append(f"**{value}**")
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in value))
        elif kind == "img":
            out.append(f"![{value[1]}]({value[0]})")
        elif kind == "code":
            out.append("```yaml\n" + value + "\n```")
        elif kind == "table":
            header, rows = value
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _html_cell(c: str) -> str:
    return f"<td><strong>{html.escape(c)}</strong></td>" if isinstance(c, Strong) else f"<td>{html.escape(c)}</td>"


def render_html(blocks: list[Block], title: str) -> str:
    e = html.escape
    body = []
    for kind, value in blocks:
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{e(value)}</{kind}>")
        elif kind == "p":  # **bold** as in the Markdown
            body.append("<p>" + re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", e(value)) + "</p>")
        elif kind == "warn":
            body.append(f'<p class="warn"><strong>{e(value)}</strong></p>')
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in value) + "</ul>")
        elif kind == "img":
            body.append(f'<figure><img src="{e(value[0])}" alt="{e(value[1])}">'
                        f"<figcaption>{e(value[1])}</figcaption></figure>")
        elif kind == "code":
            body.append(f"<pre>{e(value)}</pre>")
        elif kind == "table":
            header, rows = value
            head = "".join(f"<th>{e(h)}</th>" for h in header)
            trs = "".join("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>" for row in rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;"
             "padding:4px 8px;text-align:left}img{max-width:100%}figure{margin:1em 0}"
             ".warn{background:#fff3cd;padding:.5em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
