"""The report's text: blocks (headings, paragraphs, tables, figures, code) rendered as
Markdown and as HTML, the ranked and evaluation-length tables, and number formatting.

A block is ``(kind, value)``; the report is built once as blocks and written in both formats,
so the two never disagree. Undefined numbers are shown as such ("–", "n/a"), never as a
misleading value; HTML is escaped and a pipe inside a Markdown cell does not split it.
"""

from __future__ import annotations

import html
import math
from typing import Any

from harness.report.collect import CandidateResult
from harness.study.storage import StudyHandle

Block = tuple[str, Any]


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}g}" if math.isfinite(x) else "–"


def _count(x: float | None) -> str:
    """Parameters, tokens/s, megabytes: whole numbers with thousands separators."""
    return f"{x:,.0f}" if x is not None and math.isfinite(x) else "–"


def _interval(mean: float, ci: tuple[float, float]) -> str:
    if not math.isfinite(mean):
        return "–"
    if not all(math.isfinite(v) for v in ci):
        return f"{_fmt(mean)} (one seed)"
    return f"{_fmt(mean)} [{_fmt(ci[0])}, {_fmt(ci[1])}]"


def ranked_table(handle: StudyHandle, results: list[CandidateResult], length: int) -> Block:
    cfg = handle.config
    header = ["rank", "candidate", "model · attention · position",
              f"val/{cfg.objective.metric} @{length}: mean [95% CI]",
              f"Δ vs {cfg.baseline} [95% CI]", "p (paired)", "seeds", "params",
              "tokens/s", "peak MB", "tuning: done (pruned, failed) / budget"]
    rows = []
    for r in sorted(results, key=lambda r: (r.rank, r.name)):
        p = r.paired
        delta = "baseline" if p is None else _interval(p.mean_difference, p.ci)
        pval = "" if p is None else f"{_fmt(p.p_value, 3)} (n={p.n})"
        t = r.tuning
        rows.append([
            f"{r.rank:g}" + (" ★" if r.on_front else ""), r.name, r.label, _interval(r.mean, r.ci),
            delta, pval, str(len(r.seeds)), _count(r.cost.get("params")),
            _count(r.cost.get("tokens_per_s")), _count(r.cost.get("peak_memory")),
            f"{t['complete'] + t['pruned'] + t['failed']} ({t['pruned']}, {t['failed']}) / {t['budget']}",
        ])
    return "table", (header, rows)


def length_table(handle: StudyHandle, results: list[CandidateResult], lengths: tuple[int, ...],
                 train_length: int) -> Block:
    header = ["candidate"] + [f"{n}" + (" (train)" if n == train_length else "") for n in lengths]
    rows = [[r.name] + [_fmt(r.by_length.get(n)) for n in lengths] for r in results]
    return "table", (header, rows)


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for kind, value in blocks:
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + value)
        elif kind == "p":
            out.append(value)
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in value))
        elif kind == "img":
            out.append(f"![{value[1]}]({value[0]})")
        elif kind == "code":
            out.append("```yaml\n" + value + "\n```")
        elif kind == "table":
            header, rows = value
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def render_html(blocks: list[Block], title: str) -> str:
    e = html.escape
    body = []
    for kind, value in blocks:
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{e(value)}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{e(value)}</p>")
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
            trs = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;"
             "padding:4px 8px;text-align:left}img{max-width:100%}figure{margin:1em 0}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
