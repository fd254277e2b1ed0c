"""The compute sections of a report (harness.report.scaling) from results built by hand: the
realised compute flagged past 2% off budget, a scaling study's fits, crossover sentence,
extrapolation warning and every export (Markdown, HTML, CSV, LaTeX, JSON, DataFrame), and
the 'shared recipe, not tuned' first line."""

from __future__ import annotations

import json
import math

import numpy as np

from harness.keys import Metric
from harness.report import scaling
from harness.report import scaling_fit as sf
from harness.report.collect import CandidateResult, SeedRun
from harness.report.render import first_line, render_html, render_markdown
from harness.study.schema import parse_study_config

BUDGETS = [1e12, 1e13, 1e14]
SIZES = [{"d_model": 16}, {"d_model": 32}, {"d_model": 64}]
LAWS = {"att": sf.PowerLaw(2.0, 30.0, 0.1),
        # equal to att at 1e13 (inside the measured range), better above
        "mix": sf.PowerLaw(1.9, float(30.0 * 1e13 ** -0.1 + 0.1) * 1e13 ** 0.2, 0.2)}


def config(**extra):
    return parse_study_config({
        "task": {"name": "char_lm"}, "objective": {"metric": "loss"},
        "candidates": [{"name": n, "model": {"name": "transformer"}} for n in LAWS],
        "scaling": {"sizes": SIZES, "budgets": BUDGETS,
                    "transfer": {"rule": "scaled", "lr": 1e-2, "width": 16}},
        "budget": {"trials": 1}, "confirm": {"seeds": 3, "test": "t"}, **extra})


def results(cfg, off: float = 0.0) -> list[CandidateResult]:
    """Every cell's three seeds: a parabola in log N around N* = sqrt(C), noise 0.3%."""
    rng = np.random.default_rng(0)
    out = []
    for cand in cfg.candidates:
        cell = cand.cell
        law = LAWS[cell.base]
        n = math.sqrt(cell.budget) * math.exp(0.7 * (cell.size - 1))
        seeds = []
        for s in (1, 2, 3):
            loss = (float(law(cell.budget)) + 0.02 * (0.7 * (cell.size - 1)) ** 2) * math.exp(rng.normal(0, 0.003))
            realised = cell.budget * (1 + (off if (cell.size, s) == (0, 1) else 0.004))
            seeds.append(SeedRun(s, f"r{s}", loss, {Metric.PARAMS: n, Metric.TRAIN_FLOPS: realised,
                                                     Metric.BUDGET_FLOPS: cell.budget,
                                                     Metric.TRAIN_STEPS: 100.0}))
        out.append(CandidateResult(cand.name, "transformer", seeds, {}))
    return out


def test_a_scaling_report_fits_each_candidate_and_finds_the_crossover():
    cfg = config()
    a = scaling.analyse(cfg, results(cfg), n_boot=100)
    assert a is not None and set(a.fits) == {"att", "mix"} and not a.failed
    assert a.fits["att"].alpha.low < 0.1 < a.fits["att"].alpha.high
    [cross] = a.crossovers
    assert cross.compute is not None and 3e12 < cross.compute < 3e13
    assert cross.sentence().startswith("mix below att above")
    md = render_markdown(scaling.blocks(a))
    assert "## Scaling" in md and "α = " in md and "1/width" in md
    assert "WARNING" not in md  # the crossover is inside the measured range
    assert "<h2>Scaling</h2>" in render_html(scaling.blocks(a), "t")


def test_a_far_crossover_warns_in_the_sections_first_line():
    cfg = config()
    global LAWS
    saved = dict(LAWS)
    try:
        LAWS["mix"] = sf.PowerLaw(2.0, 30.0 * 1e17 ** 0.1, 0.2)  # crosses att at 1e17: 1000x past
        a = scaling.analyse(cfg, results(cfg), n_boot=60)
    finally:
        LAWS.clear()
        LAWS.update(saved)
    blocks = scaling.blocks(a)
    assert blocks[1][0] == "warn" and "beyond 10x" in blocks[1][1]


def test_realised_compute_is_flagged_past_2_percent():
    cfg = config()
    rows = scaling.compute_rows(results(cfg, off=0.03))
    assert len(rows) == 2 * 9 * 3
    flagged = [r for r in rows if r.flagged]
    assert len(flagged) == 6 and all(abs(r.off - 0.03) < 1e-9 for r in flagged)  # 2 x 3 budgets
    md = render_markdown(scaling.compute_blocks(rows, cfg))
    assert "6 of 54 runs are more than 2% off their budget" in md and "+3.00% ⚠" in md
    assert "Every run is within 2%" in render_markdown(scaling.compute_blocks(
        scaling.compute_rows(results(cfg)), cfg))


def test_the_exports_carry_the_same_numbers():
    cfg = config()
    a = scaling.analyse(cfg, results(cfg), n_boot=60)
    alpha = a.fits["att"].alpha
    csv_text = scaling.fits_csv(a)
    assert csv_text.splitlines()[0].startswith("candidate,unit,confidence,alpha,alpha_low,alpha_high")
    assert f"{alpha.value:.6g}" in csv_text
    assert len(scaling.runs_csv(a).splitlines()) == 1 + 2 * 27
    tex = scaling.latex_table(a)
    assert r"\toprule" in tex and f"{alpha.value:.3g}" in tex
    data = json.loads(json.dumps(scaling.summary(a)))
    assert data["fits"][0]["alpha"] == alpha.value and data["crossovers"][0]["a"] == "att"
    frame = scaling.dataframe(a)
    assert list(frame["candidate"]) == ["att", "mix"] and frame.loc[0, "alpha"] == alpha.value
    # approach 3, in every export: the same surface estimates
    surface = a.fits["att"].surface
    assert surface is not None and surface.runs == 27 and surface.cells == 9
    assert data["fits"][0]["surface_beta"] == surface.beta.value == frame.loc[0, "surface_beta"]
    assert data["surfaces"]["att"]["alpha"] == surface.surface.alpha
    assert "surface_n_opt_at_largest_low" in csv_text.splitlines()[0]
    assert f"{surface.alpha.value:.3g}" in tex.split("approach 3")[1]
    n_opt, _ = surface.optimum(surface.largest_compute)
    assert data["fits"][0]["surface_n_opt_at_largest"] == n_opt.value
    md = render_markdown(scaling.blocks(a))
    assert "att, approach 3: L(N, D) = E + A/N^α + B/D^β" in md and "a = β/(α+β)" in md


def test_an_untuned_study_says_so_first():
    from harness.report import stats
    from harness.report.collect import Protocol
    from harness.report.verdict import Verdict

    proto = Protocol("s", "loss", False, 8, 8, (8,), "a", 0.95, untuned=True)
    verdict = Verdict(0.05, "t", 0, stats.resolution_floor("t", 3, 1, 0.05), None, [], [], [], None, "")
    assert first_line(verdict, proto).startswith("Shared recipe, not tuned")
