"""The report without training: verdicts on synthetic seed values (noise only, a large
difference, ties, a cost trade-off), parameter and fixed-hyper-parameter checks, rendering,
and the golden CSV, LaTeX and Markdown exports. (Reports of real studies: tests/test_study.py
and tests/test_report_study.py.)

The golden files are rebuilt with ``UPDATE_GOLDEN=1 pytest tests/test_report.py``; review
the diff before committing it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from harness.errors import ConfigError
from harness.report.collect import CandidateResult, Protocol, SeedRun
from harness.report.document import document
from harness.report.export import (
    candidates_csv,
    finite,
    latex_table,
    parse_formats,
    seeds_csv,
    summary,
    tex,
)
from harness.report.render import Strong, interval, render_html, render_markdown
from harness.report.verdict import analyze, fixed_differences

GOLDEN = Path(__file__).parent / "golden"
TUNING = {"complete": 4, "pruned": 1, "failed": 0, "interrupted": 0, "budget": 5}


def candidate(name: str, values: dict[int, float], *, params: float = 10_000,
              tokens: float | None = None, config: dict[str, str] | None = None,
              label: str = "transformer · multi_head · rope", lengths: dict[int, list[float]] | None = None,
              searched: list[str] | None = None) -> CandidateResult:
    seeds = []
    for i, (seed, v) in enumerate(sorted(values.items())):
        metrics = {"cost/params": params, "val/acc_len16": v}
        if tokens is not None:
            metrics["cost/train_tokens_per_s"] = tokens * (1 + 0.01 * i)
        for n, vals in (lengths or {}).items():
            metrics[f"val/acc_len{n}"] = vals[i]
        seeds.append(SeedRun(seed, f"run-{name}-{seed}", v, metrics))
    return CandidateResult(name, label, seeds, dict(TUNING), config=config or {},
                           searched=searched or [])


def protocol(seeds: int, **kw) -> Protocol:
    base = dict(study="demo", metric="acc", maximize=True, length=16, train_length=16,
                lengths=(16,), baseline="a", confidence=0.95, seeds=tuple(range(1, seeds + 1)),
                task="copy {'length': 16}", tuning="every candidate tuned with 5 trials of 300 steps")
    return Protocol(**(base | kw))


def noisy(name: str, mu: float, n: int, rng: np.random.Generator, sd: float = 0.01, **kw) -> CandidateResult:
    return candidate(name, {s: float(mu + rng.normal(0, sd)) for s in range(1, n + 1)}, **kw)


# -- verdicts --------------------------------------------------------------------------------
def test_seed_noise_only_is_one_group_and_marks_nothing():
    rng = np.random.default_rng(0)
    results = [noisy(n, 0.8, 10, rng) for n in ("a", "b", "c")]  # 10 seeds: resolvable
    verdict = analyze(results, protocol(10))
    assert verdict.floor.possible
    assert not verdict.resolved and sorted(verdict.best_group) == ["a", "b", "c"]
    assert [r.rank for r in results] == [1, 1, 1]
    assert verdict.front is None and not any(r.on_front for r in results)
    md = render_markdown(document(results, verdict, protocol(10)))
    assert "★" not in md and "**" not in md.split("## Ranking")[1].split("## Parameters")[0]
    assert "No difference is resolved" in md and "share rank 1" in md
    assert "\\textbf" not in latex_table(results, verdict, protocol(10))
    assert "mathbf" not in latex_table(results, verdict, protocol(10))


def test_a_large_difference_separates_the_candidates():
    rng = np.random.default_rng(1)
    results = [noisy("a", 0.6, 8, rng), noisy("b", 0.9, 8, rng), noisy("c", 0.9, 8, rng),
               noisy("d", 0.3, 8, rng)]
    proto = protocol(8)
    verdict = analyze(results, proto)
    assert verdict.comparisons == 6 and verdict.floor.possible  # 6 * 2/2^8 = 0.047
    assert verdict.resolved and sorted(verdict.best_group) == ["b", "c"]
    ranks = {r.name: r.rank for r in results}
    assert ranks == {"b": 1, "c": 1, "a": 3, "d": 4}  # b and c tie: nothing separates them
    assert verdict.order[:2] == sorted(verdict.order[:2], key=lambda n: -next(
        r.mean for r in results if r.name == n))
    a = next(r for r in results if r.name == "a")
    assert a.vs_best is not None and a.vs_best.paired.p_adjusted <= 0.05
    assert a.vs_best.paired.mean_difference == pytest.approx(a.mean - next(
        r.mean for r in results if r.name == verdict.best))
    assert a.vs_best.improvement == 0.0
    md = render_markdown(document(results, verdict, proto))
    table = md.split("## Ranking")[1].split("\n\n")[1]
    bold = [line.split(" | ")[1] for line in table.splitlines() if "**" in line]
    assert sorted(bold) == ["b", "c"]
    assert "Best group (bold): " in md and "Resolved below the best: a (Δ = " in md


def test_too_few_seeds_is_the_first_line_everywhere():
    rng = np.random.default_rng(2)
    results = [noisy("a", 0.5, 3, rng), noisy("b", 0.9, 3, rng)]  # huge gap, 3 seeds
    verdict = analyze(results, protocol(3))
    assert not verdict.floor.possible and not verdict.resolved
    md = render_markdown(document(results, verdict, protocol(3)))
    first = md.splitlines()[0]
    assert first.startswith("**Too few seeds") and "smallest p-value is 0.25" in first
    assert "at least 6 seeds" in first
    # with the t-test the same values are resolved (it assumes normal differences)
    t_verdict = analyze(results, protocol(3, test="t"))
    assert t_verdict.floor.possible and t_verdict.resolved
    assert not render_markdown(document(results, t_verdict, protocol(3, test="t"))).startswith("**Too few")


def test_the_front_counts_only_resolved_differences():
    rng = np.random.default_rng(3)
    # b: as good as a within noise, 40% fewer parameters; c: better, larger
    results = [noisy("a", 0.80, 8, rng, params=10_000), noisy("b", 0.80, 8, rng, params=6_000),
               noisy("c", 0.95, 8, rng, params=20_000)]
    verdict = analyze(results, protocol(8))
    assert verdict.front == ["b", "c"] or sorted(verdict.front or []) == ["b", "c"]
    assert {r.name: r.on_front for r in results} == {"a": False, "b": True, "c": True}
    # equal cost within 5%: no front at all
    same = [noisy(n, mu, 8, rng, params=p) for n, mu, p in (("a", 0.8, 10_000), ("b", 0.9, 10_300))]
    v = analyze(same, protocol(8))
    assert v.front is None and "No quality-versus-cost front" in v.front_note
    # a measured cost counts only when the test resolves it over seeds
    fast = [noisy("a", 0.8, 8, rng, tokens=1000.0), noisy("b", 0.8, 8, rng, tokens=2000.0)]
    v = analyze(fast, protocol(8, front_cost="tokens_per_s"))
    assert v.front == ["b"]
    v3 = analyze([noisy("a", 0.8, 3, rng, tokens=1000.0), noisy("b", 0.8, 3, rng, tokens=2000.0)],
                 protocol(3, front_cost="tokens_per_s"))
    assert v3.front is None  # 3 seeds cannot resolve the throughput either


def test_parameter_counts_and_fixed_hyper_parameters():
    rng = np.random.default_rng(4)
    results = [
        noisy("a", 0.8, 3, rng, params=10_200, config={"model.params.tie_embeddings": "True",
                                                       "model.params.layers": "2", "train.lr": "0.01",
                                                       "model.name": "transformer", "train.seed": "1",
                                                       "model.params.d_model": "64"},
              searched=["train.lr"]),
        noisy("b", 0.8, 3, rng, params=11_000, config={"model.params.tie_embeddings": "False",
                                                       "model.params.layers": "2", "train.lr": "0.02",
                                                       "model.name": "lstm", "train.seed": "2",
                                                       "model.params.d_model": "48"},
              searched=["train.lr"]),
    ]
    results[1].matched = ["model.params.d_model"]
    proto = protocol(3, param_target=10_000)
    verdict = analyze(results, proto)
    assert results[0].params_off == pytest.approx(0.02) and results[1].params_off == pytest.approx(0.1)
    assert len(verdict.param_notes) == 1 and verdict.param_notes[0].startswith("b has 11,000")
    assert verdict.fixed_differences == {
        "model.params.d_model": {"a": "64", "b": "48 (matched)"},
        "model.params.tie_embeddings": {"a": "True", "b": "False"},
    }
    md = render_markdown(document(results, verdict, proto))
    assert "11,000 ⚠ +10%" in md and "| model.params.tie_embeddings | True | False |" in md
    assert fixed_differences([results[0]]) == {}


def test_a_tuned_value_at_the_edge_of_its_range_is_named():
    """The best trial's lr in the top tenth of its log range, its weight decay in the bottom
    tenth; a matched width and a choice are not tuning results; mid-range values say nothing."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from harness.report.collect import range_edges

    dists = {"train.lr": FloatDistribution(2e-3, 2e-2, log=True),
             "train.weight_decay": FloatDistribution(0.0, 0.1),
             "model.hidden": IntDistribution(32, 512, step=16),
             "attention.window": CategoricalDistribution([8, 64])}

    def trial(lr: float, wd: float) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(params={"train.lr": lr, "train.weight_decay": wd,
                                                 "model.hidden": 512, "attention.window": 64},
                                         distributions=dists, value=1.0)

    # 10 ** (log10(2e-3) + 0.9 * 1) = 1.59e-2: the top tenth starts there
    assert range_edges(trial(1.62e-2, 0.009), skip="model.params.hidden") == [
        "train.lr 0.0162 in the top tenth of [0.002, 0.02], log scale",
        "train.weight_decay 0.009 in the bottom tenth of [0, 0.1]"]
    assert range_edges(trial(1.56e-2, 0.011), skip="model.params.hidden") == []
    assert range_edges(trial(6e-3, 0.05)) == ["model.params.hidden 512 in the top tenth of [32, 512]"]
    rng = np.random.default_rng(5)
    results = [noisy("a", 0.8, 3, rng), noisy("b", 0.7, 3, rng)]
    results[0].edges = range_edges(trial(1.9e-2, 0.05), skip="model.params.hidden")
    proto = protocol(3)
    verdict = analyze(results, proto)
    md = render_markdown(document(results, verdict, proto))
    assert "edge of their searched range" in md and "a: train.lr 0.019 in the top tenth" in md
    assert summary(results, verdict, proto)["candidates"][0]["range_edges"] == results[0].edges


def test_a_candidate_without_values_is_listed_last_unranked():
    rng = np.random.default_rng(5)
    results = [noisy("a", 0.8, 6, rng), candidate("b", {}), noisy("c", 0.7, 6, rng)]
    verdict = analyze(results, protocol(6))
    assert verdict.order[-1] == "b" and verdict.unranked == ["b"] and results[1].rank is None
    md = render_markdown(document(results, verdict, protocol(6)))
    assert "| – | b |" in md


# -- rendering ---------------------------------------------------------------------------------
BLOCKS = [
    ("warn", "careful"),
    ("h1", "Study <x>"),
    ("p", "a | b & c"),
    ("table", (["candidate", "val/acc"], [["a|b", Strong("0.5")], ["<script>", "n/a"]])),
    ("img", ("front.png", "Quality versus cost")),
    ("list", ["note one"]),
    ("code", "model: {d_model: 32}"),
]


def test_markdown_keeps_tables_intact():
    md = render_markdown(BLOCKS)
    assert md.startswith("**careful**\n\n# Study <x>")
    assert "| a\\|b | **0.5** |" in md  # a pipe inside a cell does not split it
    assert "![Quality versus cost](front.png)" in md
    assert "```yaml\nmodel: {d_model: 32}\n```" in md


def test_html_is_escaped():
    page = render_html(BLOCKS, "Study <x>")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<title>Study &lt;x&gt;</title>" in page
    assert "<td><strong>0.5</strong></td>" in page
    assert page.count("<tr>") == 3


def test_undefined_numbers_and_escaping():
    assert interval(0.5, None) == "0.5 (one seed)"
    assert interval(math.nan, None) == "–"
    assert json.loads(json.dumps(finite({"ci": (math.nan, 1.0), "x": [math.inf]}))) == {
        "ci": [None, 1.0], "x": [None]}
    assert tex("mha_rope · 50% & $x") == r"mha\_rope $\cdot$ 50\% \& \$x"


def test_formats():
    assert parse_formats(None) == ("md", "html", "json")
    assert parse_formats(["csv,latex", "md"]) == ("md", "csv", "latex")
    assert parse_formats(["tex", "markdown"]) == ("md", "latex")
    with pytest.raises(ConfigError, match="unknown format.*pdf"):
        parse_formats(["md,pdf"])


# -- golden files --------------------------------------------------------------------------------
def golden_study() -> tuple[list[CandidateResult], Protocol]:
    """Fixed, hand-written seed values: rope clearly best, alibi within noise of it, the
    learned-position baseline clearly below, nope without a finished run."""
    lengths = {16: None, 32: None}
    rope = {1: 0.912, 2: 0.905, 3: 0.921, 4: 0.917, 5: 0.909, 6: 0.915, 7: 0.918}
    alibi = {1: 0.908, 2: 0.911, 3: 0.914, 4: 0.906, 5: 0.919, 6: 0.903, 7: 0.916}
    learned = {1: 0.802, 2: 0.811, 3: 0.794, 4: 0.808, 5: 0.799, 6: 0.815, 7: 0.806}
    def at32(vals: dict[int, float], drop: float) -> dict[int, list[float]]:
        return {32: [round(v - drop, 3) for v in vals.values()], **{k: v for k, v in lengths.items() if v}}
    results = [
        candidate("learned", learned, params=10_240, label="transformer · multi_head · learned",
                  config={"model.params.tie_embeddings": "True", "train.lr": "0.003"},
                  lengths=at32(learned, 0.4), searched=["train.lr"]),
        candidate("rope", rope, params=10_112, label="transformer · multi_head · rope",
                  config={"model.params.tie_embeddings": "False", "train.lr": "0.002"},
                  lengths=at32(rope, 0.1), searched=["train.lr"]),
        candidate("alibi", alibi, params=9_024, label="transformer · multi_head · alibi",
                  config={"model.params.tie_embeddings": "False", "train.lr": "0.004"},
                  lengths=at32(alibi, 0.02), searched=["train.lr"]),
        candidate("nope", {}, params=math.nan, label="transformer · multi_head · none"),
    ]
    for r in results:
        for s in r.seeds:
            s.metrics.setdefault("val/acc_len16", s.value)
            s.kernel = "pytorch"  # the harness.kernel tag of an attention model's runs
    proto = protocol(7, study="positions_demo", baseline="learned", lengths=(16, 32),
                     param_target=10_000, description="Which position scheme extrapolates? (synthetic)")
    return results, proto


@pytest.mark.parametrize("name", ["results.md", "candidates.csv", "seeds.csv", "table.tex", "summary.json"])
def test_golden_exports(name):
    results, proto = golden_study()
    verdict = analyze(results, proto)
    text = {
        "results.md": lambda: render_markdown(document(results, verdict, proto)),
        "candidates.csv": lambda: candidates_csv(results, verdict, proto),
        "seeds.csv": lambda: seeds_csv(results, proto),
        "table.tex": lambda: latex_table(results, verdict, proto),
        "summary.json": lambda: json.dumps(summary(results, verdict, proto), indent=2) + "\n",
    }[name]()
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rebuild with UPDATE_GOLDEN=1 and review the diff"


def test_golden_study_says_what_the_values_show():
    """The golden files are only worth keeping if their content is right: check the verdict
    they encode against the hand-written values."""
    results, proto = golden_study()
    verdict = analyze(results, proto)
    assert verdict.best == "rope" and sorted(verdict.best_group) == ["alibi", "rope"]
    assert {r.name: r.rank for r in results} == {"rope": 1, "alibi": 1, "learned": 3, "nope": None}
    # alibi is 11% smaller and not resolved worse than rope: it alone is on the front
    assert verdict.front == ["alibi"]
    learned = results[0]
    assert learned.vs_best and learned.vs_best.paired.p_value == pytest.approx(2 / 2**7)
    assert learned.vs_best.paired.p_adjusted == pytest.approx(3 * 2 / 2**7)
    assert learned.params_off == pytest.approx(0.024)
    assert results[2].params_off == pytest.approx(-0.0976)


# -- figures -----------------------------------------------------------------------------------
@pytest.fixture
def captured(monkeypatch, tmp_path):
    """The figures harness.run.plots draws, kept open for inspection instead of saved."""
    from harness.report import figures  # imported first: it binds save_figure at import
    from harness.run import plots

    figs = []

    def keep(fig, path, dpi=110):
        figs.append(fig)
        return Path(path)

    for module in (plots, figures):
        monkeypatch.setattr(module, "save_figure", keep)
    return figs


def test_extrapolation_figure_ticks_every_length_and_bands(captured, tmp_path):
    from harness.report.figures import extrapolation, palette

    results, proto = golden_study()
    analyze(results, proto)
    colors = palette([r.name for r in results])
    assert extrapolation(results, proto, colors, tmp_path / "x.png") is not None
    ax = captured[0].axes[0]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32"]
    assert any("training length (16)" in t.get_text() for t in ax.get_legend().get_texts())
    lines = {line.get_label(): line for line in ax.get_lines()}
    for r in results[:3]:  # one colour per candidate, as in the palette
        assert lines[r.name].get_color() == colors[r.name]
        assert list(lines[r.name].get_ydata()) == pytest.approx([r.by_length[16], r.by_length[32]])
    assert len(ax.collections) == 3  # a band per candidate with values
    assert palette(["a", "b"]) == {k: v for k, v in list(palette(["a", "b", "c"]).items())[:2]}


def test_attention_maps_are_labelled_on_the_outer_panels(captured, tmp_path):
    """Keys are labelled under the last layer's row, queries left of the first head's column;
    inner panels carry no tick labels (they are most of a figure's drawing time)."""
    from harness.run.plots import attention_maps

    maps = [np.random.default_rng(0).dirichlet(np.ones(4), size=(2, 4)) for _ in range(2)]
    attention_maps(maps, tmp_path / "a.png", title="run", tokens=["a", "b", "c", "d"], text="a b c d")
    fig = captured[0]
    axes = {(i, h): fig.axes[2 * i + h] for i in (0, 1) for h in (0, 1)}
    assert [ax.get_title() for ax in fig.axes] == [f"layer {i} · head {h}" for i in (0, 1) for h in (0, 1)]
    for (i, h), ax in axes.items():
        xs = [t.get_text() for t in ax.get_xticklabels()]
        ys = [t.get_text() for t in ax.get_yticklabels()]
        assert xs == (["a", "b", "c", "d"] if i == 1 else []), (i, h)
        assert ys == (["a", "b", "c", "d"] if h == 0 else []), (i, h)
        assert ax.get_xlabel() == ("key" if i == 1 else "")
        assert ax.get_ylabel() == ("query" if h == 0 else "")
    assert fig._suptitle.get_text() == "run\na b c d"


def test_long_attention_maps_label_every_kth_token_in_a_bounded_figure(captured, tmp_path):
    """At 200 tokens a map labels every 7th (at most LABELLED = 32 labels an axis) and its
    panels stay the size of 32 labelled tokens: rendering the figure is part of every run's
    fixed cost."""
    from harness.run.plots import LABELLED, attention_maps

    n = 200
    tokens = [f"t{i}" for i in range(n)]
    maps = [np.random.default_rng(1).dirichlet(np.ones(n), size=(2, n))]
    attention_maps(maps, tmp_path / "long.png", tokens=tokens)
    fig = captured[0]
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert LABELLED == 32
    assert labels == tokens[::7] and len(labels) <= LABELLED
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == tokens[::7]
    assert fig.get_size_inches()[0] <= 2 * (0.16 * LABELLED + 1.0)


def test_importance_needs_enough_trials():
    from harness.report.figures import importance_min_trials

    assert [importance_min_trials(p) for p in (1, 2, 3, 5, 8)] == [10, 10, 20, 20, 32]


@pytest.mark.parametrize("cost", ["params", "tokens_per_s", "peak_memory", "state_size"])
def test_the_front_figure_and_table_take_every_cost(cost, captured, tmp_path):
    """Every cost a study may put on its front (schema.COSTS) has an axis label, and the
    front's cost is a column of the ranked table (a study with `front: state_size` crashed
    in the figure)."""
    from harness.report.figures import front
    from harness.report.render import ranked_table
    from harness.study.schema import COST_LABELS, COSTS

    assert set(COST_LABELS) == set(COSTS)
    results = [candidate("a", {1: 0.9, 2: 0.91, 3: 0.92}), candidate("b", {1: 0.5, 2: 0.52, 3: 0.51})]
    for r, state in zip(results, (16_384.0, 1_024.0), strict=True):
        for s in r.seeds:
            s.metrics.update({"cost/state_size": state, "cost/peak_tensor_mb": state / 100,
                              "cost/train_tokens_per_s": state * 3})
    proto = protocol(3, front_cost=cost)
    verdict = analyze(results, proto)
    for r in results:
        r.tuning_points = [(r.cost[cost], r.mean)]
    assert front(None, results, verdict, proto, {"a": "C0", "b": "C1"}, tmp_path / "f.png") is not None
    assert captured[0].axes[0].get_xlabel() == COST_LABELS[cost]
    header, rows = ranked_table(results, verdict, proto)[1]
    assert ("decoding state" in header) == (cost == "state_size")
    if cost == "state_size":
        column = header.index("decoding state")
        assert sorted(row[column] for row in rows) == ["1,024", "16,384"]


def test_a_decoding_state_difference_counts_on_the_front_without_a_test():
    """State size, like the parameter count, is fixed by the architecture (the same on every
    seed): a smaller state with quality not resolved worse puts a candidate on the front (the
    first mixers_recall report said 'no front' because it tested identical values)."""
    results = [candidate("big", {1: 0.90, 2: 0.91, 3: 0.92, 4: 0.90, 5: 0.91, 6: 0.92}),
               candidate("small", {1: 0.91, 2: 0.90, 3: 0.92, 4: 0.91, 5: 0.90, 6: 0.91}),
               candidate("bad", {1: 0.30, 2: 0.31, 3: 0.32, 4: 0.30, 5: 0.31, 6: 0.29})]
    for r, state in zip(results, (4_096.0, 1_024.0, 512.0), strict=True):
        for s in r.seeds:
            s.metrics["cost/state_size"] = state
    verdict = analyze(results, protocol(6, front_cost="state_size", test="t"))
    assert sorted(verdict.front) == ["bad", "small"]  # big: not better than small, and larger


def test_failed_confirmation_seeds_are_named_first_not_dropped_silently():
    """A configuration that diverges on some seeds is ranked on those that finished, which
    flatters it: the report's first line, the headline and summary.json say so."""
    rng = np.random.default_rng(6)
    results = [noisy("steady", 3.0, 5, rng), noisy("fragile", 3.1, 3, rng)]
    results[1].failed_seeds = {
        4: "run abc FAILED while training: TrainingDiverged: training loss became nan at step 97; "
           "lower the learning rate at /x/system.py:156 in training_step.",
        5: "run def FAILED while training: TrainingDiverged: training loss became nan at step 110"}
    proto = protocol(5, maximize=False)
    verdict = analyze(results, proto)
    assert verdict.failed_seeds == ["fragile: 2 of 5 confirmation seeds failed (seeds 4, 5: "
                                    "TrainingDiverged: training loss became nan at step 97)"]
    md = render_markdown(document(results, verdict, proto))
    top = md.split("\n# ")[0]
    assert "Failed confirmation seeds: fragile: 2 of 5" in top and "conditional on finishing" in top
    assert "(fragile: 2 failed)" in md
    assert summary(results, verdict, proto)["candidates"][1]["failed_seeds"]["5"].endswith("step 110")
    assert analyze([noisy("a", 1, 3, rng), noisy("b", 2, 3, rng)], protocol(3)).failed_seeds == []
