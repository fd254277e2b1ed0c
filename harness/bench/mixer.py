"""Mixer benchmark: the measured growth of every sequence mixer and attention variant against
what each one declares (``complexity``, :class:`harness.nn.mixer.Complexity`).

Two measurements, each point in a fresh process:

* forward + backward time and peak memory of one layer against the sequence length at a
  fixed width (the attention benchmark's measurement, :mod:`harness.bench.attention`, with
  mixers named ``mixer:<name>``; a layer that runs only bidirectionally, Linformer, runs
  that way), next to ``torch.sdpa``;
* decoding time per token and decoding state against the context length (the decoding
  benchmark, :mod:`harness.bench.decode`), for every layer that generates.

Each curve's growth is the least-squares slope on log-log over the lengths from
``fit_from`` on, compared with the exponent the layer declares (``L^2`` = 2, ``L`` = 1,
``L log L`` = 1.1, ``1`` = 0): a difference above ``tolerance`` is flagged. At small
lengths the parts that grow linearly (projections) hide a quadratic term, and fixed
per-call costs hide a linear one, so slopes are fitted at the long end only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.bench import attention, common, decode

TOLERANCE = 0.35
LOG_EXTRA = 0.1  # L log L, fitted as a power of L over 1k-8k, reads about L^1.1


def declared_exponent(expr: str) -> float:
    """The power of L an expression declares, ``L log L`` read as L^1.1."""
    from harness.nn.mixer import Complexity

    value = Complexity(time=expr).exponent("time")
    return value + (LOG_EXTRA if "log" in expr else 0.0)


def names(registry: Any) -> list[str]:
    """Every attention variant and mixer, as ``kind:name``."""
    return [f"attention:{n}" for n in registry.names("attention")] + [f"mixer:{n}" for n in registry.names("mixer")]


@dataclass
class Row:
    """One layer's declared and measured growth exponents."""

    name: str
    direction: str
    declared: dict[str, str]
    measured: dict[str, float | None]

    def flags(self, tolerance: float) -> list[str]:
        out = []
        for which, expr in self.declared.items():
            got = self.measured.get(which)
            if got is not None and expr and abs(got - declared_exponent(expr)) > tolerance:
                out.append(f"{which}: declared {expr}, measured L^{got:.2f}")
        return out


def compare(registry: Any, passes: list[attention.Measurement], points: list[decode.Point],
            fit_from: int) -> list[Row]:
    """Declared vs measured exponents of every layer in ``passes``."""
    decoded = decode.slopes(points, fit_from)
    rows = []
    for name in dict.fromkeys(m.variant for m in passes):
        if name in attention.BASELINES:
            continue
        ok = [m for m in passes if m.variant == name and m.status == "ok" and m.length >= fit_from]
        kind, plain = attention.split_name(name)
        c = registry.get(kind, plain).complexity
        ran = next((m.causal for m in passes if m.variant == name and m.causal is not None), None)
        measured = {
            "time": common.loglog_slope([(m.length, m.ms or 0) for m in ok]),
            "memory": common.loglog_slope([(m.length, m.peak_mb or 0) for m in ok]),
            "decode": decoded.get(name, {}).get("time"),
        }
        declared = {"time": c.time, "memory": c.memory, "decode": c.decode if name in decoded else ""}
        rows.append(Row(name, "-" if ran is None else ("causal" if ran else "bidirectional"), declared, measured))
    return rows


def _cell(expr: str, value: float | None) -> str:
    if not expr:
        return "-"
    return f"{expr} | {'-' if value is None else f'{value:.2f}'}"


SUMMARY_HEADER = ("| layer | ran | time declared | measured | memory declared | measured "
                  "| decode declared | measured | mismatch |\n" + "|---" * 9 + "|")


def summary_rows(rows: list[Row], tolerance: float) -> list[str]:
    out = []
    for r in rows:
        flags = r.flags(tolerance)
        cells = " | ".join(_cell(r.declared[w], r.measured[w]) if r.declared[w] else "- | -"
                           for w in ("time", "memory", "decode"))
        out.append(f"| {r.name} | {r.direction} | {cells} | {'; '.join(flags) or 'no'} |")
    return out


def markdown(passes_settings: attention.Settings, passes: list[attention.Measurement],
             decode_settings: decode.Settings, points: list[decode.Point], registry: Any,
             tolerance: float, head: str) -> str:
    rows = compare(registry, passes, points, decode_settings.fit_from)
    table = "\n".join(attention.format_row(m, passes, passes_settings.baselines) for m in passes)
    return f"""{head}
## Declared against measured growth

Slopes of log(time), log(peak memory) (forward + backward of one layer) and log(time per
decoded token) on log(L), fitted over L >= {decode_settings.fit_from}; declared: the layer's
`complexity` (`L log L` read as L^{1 + LOG_EXTRA:.1f}). Mismatch: a measured slope more than
{tolerance} away from the declared exponent.

{SUMMARY_HEADER}
{chr(10).join(summary_rows(rows, tolerance))}

## Forward + backward of one layer

{attention.workload(passes_settings)}
- Layers that run only bidirectionally run that way (column `ran` above).

{attention.header(passes_settings.baselines)}
{table}

## Decoding (each layer in every block of a `transformer`)

{decode.method(decode_settings)}

{decode.HEADER}
{chr(10).join(decode.format_row(p) for p in points)}
"""
